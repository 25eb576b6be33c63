// The real daemon for the tests: `tally-load serve` (path in env TALLY_LOAD) over a fresh
// ledger in a short temporary directory (a Unix socket path must stay under ~100 bytes).

import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";

/** A policy that asks no human: refusals keep their own action. */
export const NO_ASK = "[approvals]\nask_on = []\n";

const HOW =
  "build the daemon with `cargo build -p tally-load` and run " +
  "TALLY_LOAD=target/debug/tally-load node --test clients/node/test/*.test.mjs";

function binary() {
  const bin = process.env.TALLY_LOAD;
  if (!bin) throw new Error(`env TALLY_LOAD is not set: ${HOW}`);
  try {
    fs.accessSync(bin, fs.constants.X_OK);
  } catch {
    throw new Error(`TALLY_LOAD=${bin} is not an executable file: ${HOW}`);
  }
  return bin;
}

/** @param {string} socket */
function connects(socket) {
  return new Promise((resolve) => {
    const s = net.connect(socket);
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}

export class Daemon {
  /** @param {string | undefined} policy */
  static async start(policy) {
    const d = new Daemon(policy);
    await d.ready();
    return d;
  }

  /** @param {string | undefined} policy */
  constructor(policy) {
    const bin = binary();
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "tgn-"));
    this.ledger = path.join(this.dir, "ledger");
    this.socket = path.join(this.dir, "agent.sock");
    this.operatorSocket = path.join(this.dir, "operator.sock");
    this.logPath = path.join(this.dir, "serve.log");
    const init = spawnSync(bin, ["init", "--ledger", this.ledger], { encoding: "utf8" });
    if (init.status !== 0) {
      throw new Error(`tally-load init exited ${init.status}: ${init.stdout}${init.stderr}`);
    }
    const args = ["serve", "--ledger", this.ledger, "--socket", this.socket];
    args.push("--operator-socket", this.operatorSocket);
    if (policy !== undefined) {
      const file = path.join(this.dir, "policy.toml");
      fs.writeFileSync(file, policy);
      args.push("--policy", file);
    }
    const log = fs.openSync(this.logPath, "w");
    this.proc = spawn(bin, args, { stdio: ["ignore", log, log] });
    fs.closeSync(log);
    /** @type {number | null} */
    this.exitCode = null;
    this.exited = new Promise((resolve) => this.proc.once("exit", resolve));
    this.proc.once("exit", (code, signal) => {
      this.exitCode = code ?? (signal ? -1 : null);
    });
  }

  log() {
    try {
      return fs.readFileSync(this.logPath, "utf8");
    } catch {
      return "";
    }
  }

  async ready() {
    const deadline = Date.now() + 15000;
    while (Date.now() < deadline) {
      if (this.exitCode !== null) {
        throw new Error(`tally-load serve exited ${this.exitCode}: ${this.log()}`);
      }
      if (await connects(this.socket)) return;
      await new Promise((r) => setTimeout(r, 20));
    }
    throw new Error(`tally-load serve did not listen on ${this.socket} within 15 s: ${this.log()}`);
  }

  /** kill -9: the socket file stays behind, nothing listens on it. */
  async kill() {
    if (this.exitCode === null && this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill("SIGKILL");
      await this.exited;
    }
  }

  async close() {
    await this.kill();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * `serve(t)` for a `node:test` test context: starts a daemon that is killed and removed
 * when the test ends.
 * @param {import("node:test").TestContext} t
 * @param {string} [policy]
 */
export async function serve(t, policy) {
  const d = await Daemon.start(policy);
  t.after(() => d.close());
  return d;
}
