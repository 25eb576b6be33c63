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
