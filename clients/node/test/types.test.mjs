// index.d.ts is hand-written (the package has no build step): this checks it against the
// module. Every value it declares is exported, every export is declared, and the methods
// and getters it declares on each class exist on that class.

import assert from "node:assert/strict";
import fs from "node:fs";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import * as mod from "tally-gate";

const pkg = JSON.parse(fs.readFileSync(new URL("../package.json", import.meta.url), "utf8"));
const dts = fs.readFileSync(
  fileURLToPath(new URL(`../${pkg.exports["."].types}`, import.meta.url)),
  "utf8",
);

/** The declared value exports: `export declare class|const|function NAME`. */
function declaredValues() {
  return [...dts.matchAll(/^export declare (?:class|const|function) (\w+)/gm)].map((m) => m[1]);
}

/** The methods declared in each class body: lines `  name(` or `  name<T>(`. */
function declaredMethods() {
  /** @type {Map<string, string[]>} */
  const out = new Map();
  for (const m of dts.matchAll(/^export declare class (\w+)[^{]*\{([\s\S]*?)^\}/gm)) {
    const methods = [...m[2].matchAll(/^ {2}(\w+)(?:<[^>]*>)?\(/gm)].map((x) => x[1]);
    out.set(m[1], methods);
  }
  return out;
}

test("package.json points at the module and its types", () => {
  assert.equal(pkg.name, "tally-gate");
  assert.equal(pkg.type, "module");
  assert.equal(pkg.types, pkg.exports["."].types);
  assert.equal(pkg.main, pkg.exports["."].default);
  assert.deepEqual(pkg.dependencies ?? {}, {});
  assert.equal(pkg.devDependencies, undefined);
  assert.equal(pkg.engines.node, ">=18");
  assert.equal(mod.VERSION, pkg.version);
  for (const file of pkg.files) {
    assert.ok(
      fs.existsSync(new URL(`../${file}`, import.meta.url)),
      `package.json files: ${file} is missing`,
    );
  }
});

test("index.d.ts declares exactly the module's exports", () => {
  assert.deepEqual(declaredValues().sort(), Object.keys(mod).sort());
});

test("the methods index.d.ts declares exist", () => {
  const classes = declaredMethods();
  assert.ok(classes.size >= 10, `only ${classes.size} classes parsed`);
  assert.ok(classes.get("Gate")?.includes("call"), "the parser missed Gate.call");
  for (const [name, methods] of classes) {
    const cls = /** @type {any} */ (mod)[name];
    assert.equal(typeof cls, "function", `${name} is not a class`);
    for (const method of methods) {
      if (method === "constructor") continue;
      assert.equal(
        typeof cls.prototype[method],
        "function",
        `${name}.${method} is declared but missing`,
      );
    }
  }
});

test("the error classes form the declared hierarchy", () => {
  for (const line of dts.matchAll(/^export declare class (\w+) extends (\w+)/gm)) {
    const [, name, base] = line;
    const parent = base === "Error" ? Error : /** @type {any} */ (mod)[base];
    assert.ok(
      /** @type {any} */ (mod)[name].prototype instanceof parent,
      `${name} does not extend ${base}`,
    );
  }
});

test("the Reason type is exactly the gate's reason codes (docs/GATE.md)", () => {
  const gate = fs.readFileSync(new URL("../../../docs/GATE.md", import.meta.url), "utf8");
  const table = gate.split("## Reason codes")[1].split("\n## ")[0];
  const documented = [...table.matchAll(/^\| `([a-z_]+)` \| (stop|retry|ask) \|/gm)].map((m) => m[1]);
  const union = dts.match(/^export type Reason =([\s\S]*?);/m);
  assert.ok(union, "index.d.ts declares no Reason type");
  const declared = [...union[1].matchAll(/"([a-z_]+)"/g)].map((m) => m[1]);
  assert.ok(documented.length >= 20, `only ${documented.length} codes parsed from GATE.md`);
  assert.deepEqual(declared.sort(), documented.sort());
});

test("RetryLater.waitMs is never null, and a stop says why", async () => {
  const paused = new mod.RetryLater(
    new mod.Decision({ decision: "deny", reason: "run_paused", action: "retry" }),
  );
  assert.equal(paused.retryAfterMs, null);
  assert.equal(paused.waitMs, mod.DEFAULT_RETRY_AFTER_MS);
  const limited = new mod.RetryLater(
    new mod.Decision({ decision: "deny", reason: "rate_limit_exceeded", action: "retry", retry_after_ms: 250 }),
  );
  assert.equal(limited.waitMs, 250);
  const gate = new mod.Gate("/nonexistent/agent.sock");
  assert.throws(() => /** @type {any} */ (gate).stop("r1"), TypeError);
});
