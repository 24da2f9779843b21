// posenc JavaScript client (Node.js >= 20, standard library only: global fetch, typed arrays).
//
//   import { PosencClient } from "./posenc.mjs";
//   const client = new PosencClient("http://127.0.0.1:8000");
//   const { tensors, metadata } = await client.table("/v1/sinusoidal", { max_position: 8, dim: 16 });
//   tensors.pe.data   // Float32Array, row-major, shape tensors.pe.shape = [8, 16]
//
// A tensor is { dtype, shape, data }: dtype uses the service's names (float32, bfloat16, int64, ...),
// data is the matching typed array (float16/bfloat16: Uint16Array of the raw bits; int64/uint64:
// BigInt64Array/BigUint64Array). All wire formats are little-endian; typed arrays use the host's byte
// order, which is little-endian on every platform Node.js supports in practice (checked below).

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** dtype name -> [typed array constructor, safetensors code, KServe v2 datatype]. */
export const DTYPES = {
  float64: [Float64Array, "F64", "FP64"],
  float32: [Float32Array, "F32", "FP32"],
  float16: [Uint16Array, "F16", "FP16"],
  bfloat16: [Uint16Array, "BF16", "BF16"],
  int64: [BigInt64Array, "I64", "INT64"],
  int32: [Int32Array, "I32", "INT32"],
  int16: [Int16Array, "I16", "INT16"],
  int8: [Int8Array, "I8", "INT8"],
  uint64: [BigUint64Array, "U64", "UINT64"],
  uint32: [Uint32Array, "U32", "UINT32"],
  uint16: [Uint16Array, "U16", "UINT16"],
  uint8: [Uint8Array, "U8", "UINT8"],
  bool: [Uint8Array, "BOOL", "BOOL"],
};
const BY_SAFETENSORS = Object.fromEntries(Object.entries(DTYPES).map(([name, [, st]]) => [st, name]));
const BY_KSERVE = Object.fromEntries(Object.entries(DTYPES).map(([name, [, , kv]]) => [kv, name]));
export const NPY_DESCR = {
  "<f8": "float64", "<f4": "float32", "<f2": "float16", "<i8": "int64", "<i4": "int32", "<i2": "int16",
  "|i1": "int8", "<u8": "uint64", "<u4": "uint32", "<u2": "uint16", "|u1": "uint8", "|b1": "bool",
};

/** An error answer of the service: `status` (HTTP), `type` and `message` from the JSON envelope. */
export class PosencError extends Error {
  constructor(status, message, type) {
    super(`HTTP ${status}: ${message}`);
    this.name = "PosencError";
    this.status = status;
    this.type = type;
  }
}

function toUint8(buf) {
  if (buf instanceof Uint8Array) return buf;
  if (buf instanceof ArrayBuffer) return new Uint8Array(buf);
  if (ArrayBuffer.isView(buf)) return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  throw new TypeError("expected an ArrayBuffer, a typed array or a Buffer");
}

/** Typed array over bytes[start, end) of `dtype` (copied: the slice gets its own aligned buffer). */
export function typedArray(dtype, bytes, start = 0, end = bytes.byteLength) {
  if (!LITTLE_ENDIAN) throw new Error("posenc client: big-endian hosts are not supported");
  const entry = DTYPES[dtype];
  if (!entry) throw new Error(`unsupported dtype ${dtype}`);
  const [Ctor] = entry;
  if ((end - start) % Ctor.BYTES_PER_ELEMENT !== 0) {
    throw new Error(`${end - start} bytes is not a whole number of ${dtype} elements`);
  }
  // Uint8Array's own slice copies into a fresh, aligned buffer (Buffer#slice would only make a view).
  const copy = Uint8Array.prototype.slice.call(bytes, start, end);
  return new Ctor(copy.buffer, 0, copy.byteLength / Ctor.BYTES_PER_ELEMENT);
}

const product = (shape) => shape.reduce((a, b) => a * b, 1);

/** safetensors bytes -> { tensors: { name: { dtype, shape, data } }, metadata }. */
export function parseSafetensors(buf) {
  const bytes = toUint8(buf);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLength = Number(view.getBigUint64(0, true));
  if (8 + headerLength > bytes.byteLength) throw new Error("safetensors: header runs past the end");
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLength)));
  const metadata = header.__metadata__ ?? {};
  delete header.__metadata__;
  const base = 8 + headerLength;
  const tensors = {};
  for (const [name, info] of Object.entries(header)) {
    const dtype = BY_SAFETENSORS[info.dtype];
    if (!dtype) throw new Error(`safetensors: unsupported dtype ${info.dtype} of ${name}`);
    const [begin, end] = info.data_offsets;
    const data = typedArray(dtype, bytes, base + begin, base + end);
    if (data.length !== product(info.shape)) throw new Error(`safetensors: ${name} size does not match its shape`);
    tensors[name] = { dtype, shape: info.shape, data };
  }
  return { tensors, metadata };
}

/** { name: { dtype, shape, data } } (as parseSafetensors returns them) -> safetensors bytes. */
export function encodeSafetensors(tensors, metadata = {}) {
  const header = Object.keys(metadata).length ? { __metadata__: metadata } : {};
  const parts = [];
  let offset = 0;
  for (const [name, { dtype, shape, data }] of Object.entries(tensors)) {
    const entry = DTYPES[dtype];
    if (!entry) throw new Error(`tensor ${name}: unsupported dtype ${dtype}`);
    if (data.length !== product(shape)) throw new Error(`tensor ${name}: ${data.length} values for shape [${shape}]`);
    const bytes = toUint8(data);
    header[name] = { dtype: entry[1], shape, data_offsets: [offset, offset + bytes.byteLength] };
    parts.push(bytes);
    offset += bytes.byteLength;
  }
  let headerText = JSON.stringify(header);
  headerText += " ".repeat((8 - (headerText.length % 8)) % 8);
  const headerBytes = new TextEncoder().encode(headerText);
  const out = new Uint8Array(8 + headerBytes.byteLength + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(headerBytes.byteLength), true);
  out.set(headerBytes, 8);
  let at = 8 + headerBytes.byteLength;
  for (const bytes of parts) {
    out.set(bytes, at);
    at += bytes.byteLength;
  }
  return out;
}

/** A `format=raw` response: body + X-Tensor-Name/Dtype/Shape headers -> { name, dtype, shape, data }. */
export function parseRaw(buf, headers) {
  const get = (h) => (typeof headers.get === "function" ? headers.get(h) : headers[h] ?? headers[h.toLowerCase()]);
  const dtype = get("X-Tensor-Dtype");
  const shapeText = get("X-Tensor-Shape") ?? "";
  const shape = shapeText === "" ? [] : shapeText.split(",").map(Number);
  const data = typedArray(dtype, toUint8(buf));
  if (data.length !== product(shape)) throw new Error("raw: body size does not match X-Tensor-Shape");
  return { name: get("X-Tensor-Name"), dtype, shape, data };
}

/** NumPy .npy bytes (v1/v2/v3, C order, little-endian) -> { dtype, shape, data }. */
export function parseNpy(buf) {
  const bytes = toUint8(buf);
  if (bytes[0] !== 0x93 || new TextDecoder().decode(bytes.subarray(1, 6)) !== "NUMPY") throw new Error("npy: bad magic");
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const [length, start] = bytes[6] === 1 ? [view.getUint16(8, true), 10] : [view.getUint32(8, true), 12];
  const header = new TextDecoder().decode(bytes.subarray(start, start + length));
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
  if (/'fortran_order':\s*True/.test(header)) throw new Error("npy: Fortran order is not supported");
  const shape = (/'shape':\s*\(([^)]*)\)/.exec(header)?.[1] ?? "").split(",").filter((s) => s.trim()).map(Number);
  const dtype = NPY_DESCR[descr];
  if (!dtype) throw new Error(`npy: unsupported descr ${descr}`);
  return { dtype, shape, data: typedArray(dtype, bytes, start + length) };
}

/** The v2 datatype and bytes of an input { datatype?, dtype?, shape, data } (data: typed array or list). */
function encodeInput(input) {
  const dtype = input.dtype ?? BY_KSERVE[input.datatype];
  if (!dtype) throw new Error(`input ${input.name}: give dtype (float32, ...) or datatype (FP32, ...)`);
  const [Ctor, , datatype] = DTYPES[dtype];
  let data = input.data;
  if (!(data instanceof Ctor)) data = Ctor.from(data, Ctor === BigInt64Array || Ctor === BigUint64Array ? BigInt : Number);
  if (data.length !== product(input.shape)) throw new Error(`input ${input.name}: ${data.length} values for shape [${input.shape}]`);
  return { datatype, bytes: new Uint8Array(data.buffer, data.byteOffset, data.byteLength) };
}

/** Client of one posenc server. */
export class PosencClient {
  constructor(baseUrl = "http://127.0.0.1:8000", { timeoutMs = 30000 } = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.timeoutMs = timeoutMs;
  }

  async request(path, init = {}) {
    const response = await fetch(this.baseUrl + path, { ...init, signal: AbortSignal.timeout(this.timeoutMs) });
    if (!response.ok) {
      const text = await response.text();
      let message = text;
      let type;
      try {
        const doc = JSON.parse(text);
        message = doc.error ?? text;
        type = doc.type;
      } catch {
        // not the JSON envelope: keep the text
      }
      throw new PosencError(response.status, message, type);
    }
    return response;
  }

  async json(path) {
    return (await this.request(path)).json();
  }

  /**
   * A v1 table. format: safetensors (default, all tensors), npy, raw (one tensor), json.
   * `body` (an object) POSTs it as JSON, for the tables described by a body (e.g. /v1/rope/mrope segments).
   */
  async table(path, params = {}, { format = "safetensors", tensor, body } = {}) {
    const query = new URLSearchParams({ ...Object.fromEntries(Object.entries(params).map(([k, v]) => [k, String(v)])), format });
    if (tensor) query.set("tensor", tensor);
    const init = body === undefined ? {} :
      { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } };
    const response = await this.request(`${path}?${query}`, init);
    if (format === "json") return response.json();
    const bytes = new Uint8Array(await response.arrayBuffer());
    if (format === "safetensors") return parseSafetensors(bytes);
    if (format === "npy") return parseNpy(bytes);
    if (format === "raw") return parseRaw(bytes, response.headers);
    throw new Error(`unknown format ${format}`);
  }

  /**
   * Check your tensors against the golden table of `path` (e.g. "/v1/rope") with the same `params`.
   * tensors: { cos: { dtype: "float32", shape: [rows, dim], data: Float32Array }, ... }.
   * Returns the diagnosis: { verdict: "matches" | "mismatch", likely_cause, summary, agreement,
   * diagnosis: [{ name, residual, explains, explanation }], golden_table: { method, url } }.
   */
  async check(path, params, tensors) {
    const query = new URLSearchParams(Object.entries(params).map(([k, v]) => [k, String(v)]));
    const response = await this.request(`/v1/check/${path.replace(/^\/?v1\//, "")}?${query}`, {
      method: "POST", body: encodeSafetensors(tensors), headers: { "Content-Type": "application/x-safetensors" },
    });
    return response.json();
  }

  /** KServe v2 model metadata (name, inputs, outputs, ...), or null when the server has no such model. */
  async model(name) {
    try {
      return await this.json(`/v2/models/${encodeURIComponent(name)}`);
    } catch (err) {
      if (err instanceof PosencError && err.status === 404) return null;
      throw err;
    }
  }

  /**
   * Run `model` with the binary tensor extension.
   * inputs: [{ name, shape, dtype: "float32" | datatype: "FP32", data: typed array or number list }].
   * Returns { model_name, id, outputs: { name: { dtype, datatype, shape, data } } }.
   */
  async infer(model, inputs, { outputs, id } = {}) {
    const encoded = inputs.map(encodeInput);
    const header = {
      ...(id ? { id } : {}),
      inputs: inputs.map((input, i) => ({
        name: input.name, shape: input.shape, datatype: encoded[i].datatype,
        parameters: { binary_data_size: encoded[i].bytes.byteLength },
      })),
      ...(outputs ? { outputs: outputs.map((name) => ({ name, parameters: { binary_data: true } })) }
                  : { parameters: { binary_data_output: true } }),
    };
    const headerBytes = new TextEncoder().encode(JSON.stringify(header));
    const body = new Uint8Array(headerBytes.byteLength + encoded.reduce((n, e) => n + e.bytes.byteLength, 0));
    body.set(headerBytes, 0);
    let offset = headerBytes.byteLength;
    for (const { bytes } of encoded) {
      body.set(bytes, offset);
      offset += bytes.byteLength;
    }
    const response = await this.request(`/v2/models/${encodeURIComponent(model)}/infer`, {
      method: "POST", body,
      headers: { "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": String(headerBytes.byteLength) },
    });
    return parseInferResponse(new Uint8Array(await response.arrayBuffer()), response.headers);
  }
}

/** A v2 infer response (JSON, or JSON header + binary outputs in order) -> { outputs: {name: tensor} }. */
export function parseInferResponse(bytes, headers) {
  const declared = headers.get("Inference-Header-Content-Length");
  const headerLength = declared === null ? bytes.byteLength : Number(declared);
  const doc = JSON.parse(new TextDecoder().decode(bytes.subarray(0, headerLength)));
  let offset = headerLength;
  const outputs = {};
  for (const out of doc.outputs ?? []) {
    const dtype = BY_KSERVE[out.datatype];
    const size = out.parameters?.binary_data_size;
    let data;
    if (size !== undefined) {
      data = typedArray(dtype, bytes, offset, offset + size);
      offset += size;
    } else {
      const [Ctor] = DTYPES[dtype];
      data = Ctor.from(out.data, Ctor === BigInt64Array || Ctor === BigUint64Array ? BigInt : Number);
    }
    outputs[out.name] = { dtype, datatype: out.datatype, shape: out.shape, data };
  }
  return { model_name: doc.model_name, model_version: doc.model_version, id: doc.id, outputs };
}
