// Tests of the JavaScript client against a live posenc server.
//
//   POSENC_URL=http://127.0.0.1:8000 POSENC_FIXTURES=/tmp/fixtures.json node --test
//
// POSENC_FIXTURES is written by scripts/client_fixtures.py: the numbers the Python side computes
// (tables from the numeric core / the app in-process, inference outputs from onnxruntime run directly
// on the model file). scripts/js-client-test.sh does all of it: fixtures, server, tests.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import { DTYPES, NPY_DESCR, PosencClient, PosencError, parseNpy, parseSafetensors, typedArray } from "../posenc.mjs";

const URL_ = process.env.POSENC_URL;
const FIXTURES = process.env.POSENC_FIXTURES;
if (!URL_ || !FIXTURES) {
  throw new Error("set POSENC_URL (a running server) and POSENC_FIXTURES (scripts/client_fixtures.py output)");
}
const fixtures = JSON.parse(readFileSync(FIXTURES, "utf8"));
const client = new PosencClient(URL_);

/** The fixture tensor as a typed array of its dtype. */
function expected(doc) {
  const bytes = new Uint8Array(Buffer.from(doc.b64, "base64"));
  return typedArray(doc.dtype, bytes);
}

/** Byte-for-byte equality of two typed arrays (exact numbers, bf16/f16 bits and -inf included). */
function assertSameBytes(actual, wanted, what) {
  assert.equal(actual.constructor.name, wanted.constructor.name, `${what}: array type`);
  assert.equal(actual.length, wanted.length, `${what}: length`);
  const a = new Uint8Array(actual.buffer, actual.byteOffset, actual.byteLength);
  const b = new Uint8Array(wanted.buffer, wanted.byteOffset, wanted.byteLength);
  const at = a.findIndex((x, i) => x !== b[i]);
  assert.equal(at, -1, `${what}: first differing byte at ${at}`);
}

/** JSON values ("Infinity"/"NaN" strings included) against the typed array, element by element. */
function assertJsonValues(values, wanted, dtype, what) {
  const toNumber = (v) => (typeof v === "string" ? Number(v) : v);
  assert.equal(values.length, wanted.length, `${what}: length`);
  for (let i = 0; i < values.length; i++) {
    let w = wanted[i];
    if (dtype === "float16" || dtype === "bfloat16") continue; // bits compared in the binary formats
    if (typeof w === "bigint") w = Number(w);
    const v = toNumber(values[i]);
    assert.ok(Object.is(v, w) || v === w, `${what}[${i}]: ${v} != ${w}`);
  }
}

// Every table case scripts/client_fixtures.py defines (its CASES), by endpoint: the fixture script
// fails when one does not answer 200, and this test fails when the fixtures hold any other set, so no
// case is dropped silently. Add a case there, count it here.
const EXPECTED_TABLE_CASES = {
  "/v1/sinusoidal": 3,
  "/v1/rope": 2,
  "/v1/alibi/slopes": 1,
  "/v1/alibi/bias": 1,
  "/v1/t5/buckets": 1,
  "/v1/deberta/buckets": 1,
  "/v1/relative/clipped": 1,
};

describe("tables", () => {
  test("the fixtures hold exactly the expected table cases", () => {
    const counts = {};
    for (const c of fixtures.tables) counts[c.endpoint] = (counts[c.endpoint] ?? 0) + 1;
    assert.deepEqual(counts, EXPECTED_TABLE_CASES);
    const total = Object.values(EXPECTED_TABLE_CASES).reduce((a, b) => a + b, 0);
    assert.equal(fixtures.tables.length, total);
    const labels = fixtures.tables.map((c) => `${c.endpoint}?${new URLSearchParams(c.params)}`);
    assert.equal(new Set(labels).size, labels.length, `duplicate table cases: ${labels}`);
  });

  for (const c of fixtures.tables) {
    const label = `${c.endpoint}?${new URLSearchParams(c.params)}`;
    test(`safetensors ${label}`, async () => {
      const { tensors, metadata } = await client.table(c.endpoint, c.params);
      assert.deepEqual(Object.keys(tensors).sort(), Object.keys(c.tensors).sort());
      assert.equal(typeof metadata.posenc_version, "string");
      for (const [name, doc] of Object.entries(c.tensors)) {
        assert.equal(tensors[name].dtype, doc.dtype);
        assert.deepEqual(tensors[name].shape, doc.shape);
        assertSameBytes(tensors[name].data, expected(doc), `${label} ${name}`);
      }
    });
    test(`raw, npy and json ${label}`, async () => {
      for (const [name, doc] of Object.entries(c.tensors)) {
        const want = expected(doc);
        const raw = await client.table(c.endpoint, c.params, { format: "raw", tensor: name });
        assert.equal(raw.name, name);
        assert.deepEqual([raw.dtype, raw.shape], [doc.dtype, doc.shape]);
        assertSameBytes(raw.data, want, `raw ${name}`);
        if (doc.dtype !== "bfloat16") {
          const npy = await client.table(c.endpoint, c.params, { format: "npy", tensor: name });
          assert.deepEqual([npy.dtype, npy.shape], [doc.dtype, doc.shape]);
          assertSameBytes(npy.data, want, `npy ${name}`);
        }
        const json = await client.table(c.endpoint, c.params, { format: "json", tensor: name });
        assert.deepEqual(json.tensors[name].shape, doc.shape);
        assertJsonValues(json.tensors[name].data, want, doc.dtype, `json ${name}`);
      }
    });
  }

  test("a bad parameter is a PosencError with the service's message", async () => {
    await assert.rejects(client.table("/v1/sinusoidal", { max_position: 0, dim: 8 }), (err) => {
      assert.ok(err instanceof PosencError);
      assert.equal(err.status, 422);
      assert.match(err.message, /max_position/);
      return true;
    });
  });
});

describe("check", () => {
  const params = { max_position: 32, head_dim: 16 };

  test("a golden table matches; GPT-J pairs are diagnosed as the layout mistake", async () => {
    const golden = (await client.table("/v1/rope", params)).tensors;
    const mine = { cos: golden.cos, sin: golden.sin };
    const same = await client.check("/v1/rope", params, mine);
    assert.equal(same.verdict, "matches");
    assert.equal(same.likely_cause, null);
    const pairs = (await client.table("/v1/rope", { ...params, layout: "interleaved" })).tensors;
    const report = await client.check("/v1/rope", params, { cos: pairs.cos, sin: pairs.sin });
    assert.equal(report.verdict, "mismatch");
    assert.equal(report.likely_cause, "layout");
    assert.equal(report.diagnosis[0].residual, 0);
    assert.match(report.diagnosis[0].explanation, /GPT-J/);
    assert.equal(report.golden_table.url, "/v1/rope?max_position=32&head_dim=16");
  });

  test("a tensor of the wrong shape is a 422 PosencError", async () => {
    const data = new Float32Array(8);
    await assert.rejects(client.check("/v1/sinusoidal", { max_position: 4, dim: 4 }, { pe: { dtype: "float32", shape: [2, 4], data } }),
      (err) => err instanceof PosencError && err.status === 422 && /\[4, 4\]/.test(err.message));
  });
});

describe("parsers", () => {
  test("safetensors with several dtypes and unaligned offsets", () => {
    // Hand-built file: an int8 tensor first puts the float32 one at an odd offset.
    const header = JSON.stringify({
      __metadata__: { k: "v" },
      a: { dtype: "I8", shape: [3], data_offsets: [0, 3] },
      b: { dtype: "F32", shape: [2], data_offsets: [3, 11] },
    });
    const headerBytes = new TextEncoder().encode(header.padEnd(Math.ceil(header.length / 8) * 8, " "));
    const file = new Uint8Array(8 + headerBytes.length + 11);
    new DataView(file.buffer).setBigUint64(0, BigInt(headerBytes.length), true);
    file.set(headerBytes, 8);
    file.set([1, 255, 3], 8 + headerBytes.length);
    new DataView(file.buffer).setFloat32(8 + headerBytes.length + 3, 1.5, true);
    new DataView(file.buffer).setFloat32(8 + headerBytes.length + 7, -2, true);
    const { tensors, metadata } = parseSafetensors(Buffer.from(file));
    assert.deepEqual(metadata, { k: "v" });
    assert.deepEqual(Array.from(tensors.a.data), [1, -1, 3]);
    assert.deepEqual(Array.from(tensors.b.data), [1.5, -2]);
  });

  test("npy v1 file, int64, 1-d shape", () => {
    const text = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }";
    const padded = text.padEnd(64 - 10 - 1, " ") + "\n";
    const file = new Uint8Array(10 + padded.length + 16);
    file.set([0x93, ...new TextEncoder().encode("NUMPY"), 1, 0], 0);
    new DataView(file.buffer).setUint16(8, padded.length, true);
    file.set(new TextEncoder().encode(padded), 10);
    new DataView(file.buffer).setBigInt64(10 + padded.length, -5n, true);
    new DataView(file.buffer).setBigInt64(18 + padded.length, 7n, true);
    const { dtype, shape, data } = parseNpy(file);
    assert.deepEqual([dtype, shape, Array.from(data)], ["int64", [2], [-5n, 7n]]);
  });
});

describe("inference (KServe v2, binary tensors)", () => {
  test("outputs equal onnxruntime run directly on the model file", async (t) => {
    const c = fixtures.infer;
    if (!c) {
      t.skip("the model repository (onnx/) has no model: nothing to run");
      return;
    }
    const metadata = await client.model(c.model);
    if (!metadata) {
      t.skip(`the server lists no model ${c.model} (GET /v2/models/${c.model} is 404)`);
      return;
    }
    const inputs = Object.entries(c.inputs).map(([name, doc]) => ({ name, shape: doc.shape, dtype: doc.dtype, data: expected(doc) }));
    const result = await client.infer(c.model, inputs, { id: "js-client-test" });
    assert.equal(result.id, "js-client-test");
    for (const [name, doc] of Object.entries(c.outputs)) {
      const got = result.outputs[name];
      assert.ok(got, `output ${name} present`);
      assert.deepEqual([got.dtype, got.shape], [doc.dtype, doc.shape]);
      const want = expected(doc);
      let worst = 0;
      for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(got.data[i] - want[i]));
      // Same runtime and inputs; batching may change the summation order a little, never more.
      assert.ok(worst <= 1e-5, `${name}: max abs difference ${worst}`);
    }
  });

  test("an unknown model is a 404 PosencError", async () => {
    await assert.rejects(client.infer("no_such_model", [{ name: "x", shape: [1], dtype: "float32", data: [0] }]),
      (err) => err instanceof PosencError && err.status === 404);
  });
});

// The client's dtype table against models/dtypes.py (the fixtures' `dtypes`): names, safetensors and
// KServe spellings, element sizes and .npy descrs, so a dtype added or renamed there fails here.
test("the dtype table matches models/dtypes.py", () => {
  const byName = Object.fromEntries(Object.entries(NPY_DESCR).map(([descr, name]) => [name, descr.slice(1)]));
  const ours = Object.entries(DTYPES).map(([name, [Ctor, safetensors, kserve]]) =>
    ({ name, safetensors, kserve, size: Ctor.BYTES_PER_ELEMENT, npy: byName[name] ?? null }));
  const key = (d) => d.name;
  assert.ok(fixtures.dtypes.length >= 13, `only ${fixtures.dtypes.length} dtypes in the fixtures`);
  assert.deepEqual([...ours].sort((a, b) => key(a).localeCompare(key(b))),
    [...fixtures.dtypes].sort((a, b) => key(a).localeCompare(key(b))));
});
