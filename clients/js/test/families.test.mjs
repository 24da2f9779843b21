// The families added after the first round, read with the same client: XLNet's relative sinusoid and the
// vision RoPE (GET), M-RoPE (POST with a JSON sequence description). Values are checked against their
// closed forms, computed here.
import assert from "node:assert/strict";
import { test } from "node:test";

import { PosencClient } from "../posenc.mjs";

const client = new PosencClient(process.env.POSENC_URL);

function assertClose(actual, wanted, what, tol = 1e-6) {
  assert.ok(Math.abs(actual - wanted) <= tol * Math.max(1, Math.abs(wanted)), `${what}: ${actual} vs ${wanted}`);
}

test("XLNet relative sinusoid: rows klen .. -qlen+1 of [sin(d·f), cos(d·f)]", async () => {
  const [qlen, klen, dModel] = [3, 4, 8];
  const { tensors } = await client.table("/v1/relative/sinusoidal", { qlen, klen, d_model: dModel });
  const { shape, data } = tensors.pos_emb;
  assert.deepEqual(shape, [klen + qlen, 1, dModel]);
  const half = dModel / 2;
  for (let row = 0; row < shape[0]; row++) {
    const distance = klen - row;
    for (let j = 0; j < half; j++) {
      const angle = distance / 10000 ** ((2 * j) / dModel);
      assertClose(data[row * dModel + j], Math.sin(angle), `sin row ${row} col ${j}`);
      assertClose(data[row * dModel + half + j], Math.cos(angle), `cos row ${row} col ${j}`);
    }
  }
});

test("Pixtral vision RoPE: one row per patch, the first patch at angle 0", async () => {
  const { tensors } = await client.table("/v1/rope/vision", { model: "pixtral", head_dim: 8, height: 2, width: 3 });
  assert.deepEqual(tensors.cos.shape, [6, 8]);
  assert.ok(tensors.cos.data.slice(0, 8).every((v) => v === 1));
  assert.ok(tensors.sin.data.slice(0, 8).every((v) => v === 0));
});

test("M-RoPE of text alone equals plain RoPE at the same positions", async () => {
  const body = { segments: [{ type: "text", length: 5 }] };
  const mrope = await client.table("/v1/rope/mrope", { head_dim: 8, mrope_section: "1,1,2" }, { body });
  const plain = await client.table("/v1/rope", { max_position: 5, head_dim: 8 });
  for (const name of ["cos", "sin"]) {
    assert.deepEqual(mrope.tensors[name].shape, plain.tensors[name].shape);
    plain.tensors[name].data.forEach((v, i) => assertClose(mrope.tensors[name].data[i], v, `${name}[${i}]`));
  }
});
