//! Client of the posenc service: positional-encoding tables as safetensors or raw tensors, and
//! KServe v2 inference with binary tensors. HTTP with `ureq` (plain http, no TLS), JSON with `serde_json`.
//!
//! ```no_run
//! let client = posenc_client::Client::new("http://127.0.0.1:8000");
//! let table = client.table("/v1/rope", &[("max_position", "8"), ("head_dim", "64")]).unwrap();
//! let cos = table.tensors["cos"].to_f64().unwrap(); // row-major, shape table.tensors["cos"].shape
//! ```
//!
//! All wire formats are little-endian; float16/bfloat16 stay raw bits in `Tensor::data` and are
//! widened by `Tensor::to_f64`.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::time::Duration;

use serde_json::{json, Value};
use url::Url;

/// Every element type the client decodes, as (service name, safetensors code, KServe v2 datatype,
/// element size in bytes): the table models/dtypes.py defines on the service side.
pub const DTYPES: [(&str, &str, &str, usize); 13] = [
    ("float64", "F64", "FP64", 8),
    ("float32", "F32", "FP32", 4),
    ("float16", "F16", "FP16", 2),
    ("bfloat16", "BF16", "BF16", 2),
    ("int64", "I64", "INT64", 8),
    ("int32", "I32", "INT32", 4),
    ("int16", "I16", "INT16", 2),
    ("int8", "I8", "INT8", 1),
    ("uint64", "U64", "UINT64", 8),
    ("uint32", "U32", "UINT32", 4),
    ("uint16", "U16", "UINT16", 2),
    ("uint8", "U8", "UINT8", 1),
    ("bool", "BOOL", "BOOL", 1),
];

/// The dtype entry whose service, safetensors or KServe name is `name`.
fn dtype(name: &str) -> Result<(&'static str, &'static str, &'static str, usize), Error> {
    DTYPES
        .iter()
        .copied()
        .find(|(n, st, kv, _)| *n == name || *st == name || *kv == name)
        .ok_or_else(|| Error::Decode(format!("unsupported dtype {}", name)))
}

/// Everything that can go wrong: the service's error answer, transport, or undecodable bytes.
#[derive(Debug)]
pub enum Error {
    /// An error answer: HTTP status and the `{"error", "type"}` envelope.
    Service { status: u16, kind: String, message: String },
    Transport(String),
    Decode(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Service { status, kind, message } => write!(f, "HTTP {} ({}): {}", status, kind, message),
            Error::Transport(m) => write!(f, "transport: {}", m),
            Error::Decode(m) => write!(f, "decode: {}", m),
        }
    }
}

impl std::error::Error for Error {}

/// One array: the service's dtype name, shape and little-endian row-major bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Tensor {
    /// Checks that the bytes hold exactly the shape's elements of the dtype.
    pub fn new(dtype: &str, shape: Vec<usize>, data: Vec<u8>) -> Result<Tensor, Error> {
        let (name, _, _, size) = self::dtype(dtype)?;
        let t = Tensor { dtype: name.to_string(), shape, data };
        if t.data.len() != t.len() * size {
            return Err(Error::Decode(format!("{} bytes for shape {:?} of {}", t.data.len(), t.shape, name)));
        }
        Ok(t)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element as f64: float16/bfloat16 bits decoded, integers converted.
    pub fn to_f64(&self) -> Result<Vec<f64>, Error> {
        let (_, _, _, size) = dtype(&self.dtype)?;
        let d = self.dtype.as_str();
        Ok(self
            .data
            .chunks_exact(size)
            .map(|b| match d {
                "float64" => f64::from_le_bytes(b.try_into().unwrap()),
                "float32" => f32::from_le_bytes(b.try_into().unwrap()) as f64,
                "float16" => f16_to_f64(u16::from_le_bytes([b[0], b[1]])),
                "bfloat16" => bf16_to_f64(u16::from_le_bytes([b[0], b[1]])),
                "int64" => i64::from_le_bytes(b.try_into().unwrap()) as f64,
                "int32" => i32::from_le_bytes(b.try_into().unwrap()) as f64,
                "int16" => i16::from_le_bytes([b[0], b[1]]) as f64,
                "int8" => b[0] as i8 as f64,
                "uint64" => u64::from_le_bytes(b.try_into().unwrap()) as f64,
                "uint32" => u32::from_le_bytes(b.try_into().unwrap()) as f64,
                "uint16" => u16::from_le_bytes([b[0], b[1]]) as f64,
                _ => b[0] as f64, // uint8, bool
            })
            .collect())
    }

    /// The elements of an int64 tensor.
    pub fn to_i64(&self) -> Result<Vec<i64>, Error> {
        if self.dtype != "int64" {
            return Err(Error::Decode(format!("to_i64 of a {} tensor", self.dtype)));
        }
        Ok(self.data.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect())
    }
}

/// IEEE 754 half-precision bits to f64 (subnormals, infinities and NaN included).
pub fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f64;
    match exp {
        0 => sign * frac * 2f64.powi(-24),
        31 if frac != 0.0 => f64::NAN,
        31 => sign * f64::INFINITY,
        _ => sign * (1.0 + frac / 1024.0) * 2f64.powi(exp - 15),
    }
}

/// bfloat16 bits (the top half of a float32) to f64.
pub fn bf16_to_f64(bits: u16) -> f64 {
    f32::from_bits((bits as u32) << 16) as f64
}

/// A decoded safetensors file: tensors by name and the `__metadata__` strings.
#[derive(Debug)]
pub struct Bundle {
    pub tensors: BTreeMap<String, Tensor>,
    pub metadata: BTreeMap<String, String>,
}

/// A JSON array of non-negative integers (a shape, data offsets).
fn usizes(v: &Value) -> Option<Vec<usize>> {
    v.as_array()?.iter().map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok())).collect()
}

/// safetensors bytes: u64 little-endian header length, JSON header, tensor bytes.
pub fn parse_safetensors(bytes: &[u8]) -> Result<Bundle, Error> {
    let bad = |m: &str| Error::Decode(format!("safetensors: {}", m));
    let n = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).ok_or_else(|| bad("too short"))?;
    let n = usize::try_from(n).ok().filter(|n| *n <= bytes.len() - 8).ok_or_else(|| bad("header past the end"))?;
    let header: BTreeMap<String, Value> =
        serde_json::from_slice(&bytes[8..8 + n]).map_err(|e| bad(&format!("header: {}", e)))?;
    let data = &bytes[8 + n..];
    let mut bundle = Bundle { tensors: BTreeMap::new(), metadata: BTreeMap::new() };
    for (name, info) in header {
        if name == "__metadata__" {
            bundle.metadata = serde_json::from_value(info).map_err(|e| bad(&format!("__metadata__: {}", e)))?;
            continue;
        }
        let st = info["dtype"].as_str().ok_or_else(|| bad(&format!("no dtype for {}", name)))?;
        let shape = usizes(&info["shape"]).ok_or_else(|| bad(&format!("no shape for {}", name)))?;
        let slice = match usizes(&info["data_offsets"]).as_deref() {
            Some(&[begin, end]) if begin <= end => data.get(begin..end),
            _ => None,
        }
        .ok_or_else(|| bad(&format!("bad data_offsets of {}", name)))?;
        bundle.tensors.insert(name, Tensor::new(dtype(st)?.0, shape, slice.to_vec())?);
    }
    Ok(bundle)
}

/// A raw body with its X-Tensor-Dtype and X-Tensor-Shape header values.
pub fn parse_raw(body: Vec<u8>, dtype: &str, shape: &str) -> Result<Tensor, Error> {
    let shape = shape
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse::<usize>().map_err(|_| Error::Decode(format!("bad X-Tensor-Shape {}", shape))))
        .collect::<Result<Vec<_>, _>>()?;
    Tensor::new(dtype, shape, body)
}

/// Outputs of one inference, by name.
#[derive(Debug)]
pub struct InferResult {
    pub model_name: String,
    pub id: String,
    pub outputs: BTreeMap<String, Tensor>,
}

/// A v2 infer response: JSON header of `header_length` bytes, then the binary outputs in order.
pub fn parse_infer_response(body: &[u8], header_length: Option<&str>) -> Result<InferResult, Error> {
    let bad = |m: String| Error::Decode(format!("infer response: {}", m));
    let n = match header_length {
        Some(h) => h.parse::<usize>().ok().filter(|n| *n <= body.len()).ok_or_else(|| bad(h.to_string()))?,
        None => body.len(),
    };
    let doc: Value = serde_json::from_slice(&body[..n]).map_err(|e| bad(e.to_string()))?;
    let text = |k: &str| doc[k].as_str().unwrap_or_default().to_string();
    let mut result = InferResult { model_name: text("model_name"), id: text("id"), outputs: BTreeMap::new() };
    let mut offset = n;
    for out in doc["outputs"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let name = out["name"].as_str().unwrap_or_default();
        let size = out["parameters"]["binary_data_size"]
            .as_u64()
            .and_then(|s| usize::try_from(s).ok())
            .ok_or_else(|| bad(format!("output {} is not binary", name)))?;
        let bytes = body
            .get(offset..offset.saturating_add(size))
            .ok_or_else(|| bad(format!("output {} past the end", name)))?;
        offset += size;
        let datatype = out["datatype"].as_str().unwrap_or_default();
        let shape = usizes(&out["shape"]).ok_or_else(|| bad(format!("shape of {}", name)))?;
        result.outputs.insert(name.to_string(), Tensor::new(dtype(datatype)?.0, shape, bytes.to_vec())?);
    }
    Ok(result)
}

/// A response read to the end: the headers the client asked to keep (lower-case names) and the body.
struct Response {
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// Reads the body to the end, keeping the named headers (lower case).
    fn read(r: ureq::Response, names: &[&str]) -> Result<Response, Error> {
        let headers = names.iter().filter_map(|n| r.header(n).map(|v| (n.to_string(), v.to_string()))).collect();
        let mut body = Vec::new();
        r.into_reader().read_to_end(&mut body).map_err(|e| Error::Transport(format!("reading the body: {}", e)))?;
        Ok(Response { headers, body })
    }
}

/// Client of one posenc server (one `ureq::Agent`: connections are kept alive and reused).
pub struct Client {
    base: Result<Url, String>,
    agent: ureq::Agent,
    pub timeout: Duration,
}

impl Client {
    /// `base_url` like `http://127.0.0.1:8000` (a path prefix is kept); requests time out after 30 s.
    pub fn new(base_url: &str) -> Client {
        let base = Url::parse(base_url)
            .map_err(|e| format!("{}: {}", base_url, e))
            .and_then(|u| if u.cannot_be_a_base() { Err(format!("{}: not a base URL", base_url)) } else { Ok(u) });
        Client { base, agent: ureq::AgentBuilder::new().build(), timeout: Duration::from_secs(30) }
    }

    /// The base URL with `segments` appended to its path, each percent-encoded ('/' and '%' included).
    fn url<'a>(&self, segments: impl IntoIterator<Item = &'a str>) -> Result<Url, Error> {
        let mut url = self.base.clone().map_err(Error::Transport)?;
        url.path_segments_mut().map_err(|_| Error::Transport("not a base URL".into()))?.pop_if_empty().extend(segments);
        Ok(url)
    }

    /// Sends the request; an error status becomes `Error::Service` with the envelope's message and type.
    fn send(&self, request: ureq::Request, body: Option<&[u8]>, headers: &[&str]) -> Result<Response, Error> {
        let request = request.timeout(self.timeout);
        let sent = match body {
            Some(b) => request.send_bytes(b),
            None => request.call(),
        };
        match sent {
            Ok(r) => Response::read(r, headers),
            Err(ureq::Error::Status(status, r)) => {
                let text = String::from_utf8_lossy(&Response::read(r, &[])?.body).into_owned();
                // The {"error", "type"} envelope; any other body is the message as it came.
                let doc = serde_json::from_str::<Value>(&text).unwrap_or_default();
                let (kind, message) = match doc["error"].as_str() {
                    Some(error) => (doc["type"].as_str().unwrap_or_default().to_string(), error.to_string()),
                    None => (String::new(), text),
                };
                Err(Error::Service { status, kind, message })
            }
            Err(ureq::Error::Transport(t)) => Err(Error::Transport(t.to_string())),
        }
    }

    fn get(&self, path: &str, params: &[(&str, &str)], extra: &[(&str, &str)], headers: &[&str]) -> Result<Response, Error> {
        let mut url = self.url(path.split('/').filter(|s| !s.is_empty()))?;
        url.query_pairs_mut().extend_pairs(params.iter().chain(extra));
        self.send(self.agent.request_url("GET", &url), None, headers)
    }

    /// GET a v1 table (e.g. "/v1/rope") as safetensors: every tensor and the metadata.
    pub fn table(&self, path: &str, params: &[(&str, &str)]) -> Result<Bundle, Error> {
        parse_safetensors(&self.get(path, params, &[("format", "safetensors")], &[])?.body)
    }

    /// GET one tensor with format=raw (`tensor`: None for one-tensor tables); returns (X-Tensor-Name, tensor).
    pub fn raw_tensor(&self, path: &str, params: &[(&str, &str)], tensor: Option<&str>) -> Result<(String, Tensor), Error> {
        let mut extra = vec![("format", "raw")];
        extra.extend(tensor.map(|t| ("tensor", t)));
        let r = self.get(path, params, &extra, &["x-tensor-name", "x-tensor-dtype", "x-tensor-shape"])?;
        let header = |k: &str| r.header(k).unwrap_or_default().to_string();
        let (name, dtype, shape) = (header("x-tensor-name"), header("x-tensor-dtype"), header("x-tensor-shape"));
        Ok((name, parse_raw(r.body, &dtype, &shape)?))
    }

    /// Run `model` with binary tensors: JSON header, then each input's bytes; the
    /// Inference-Header-Content-Length header says where the JSON ends. Outputs come back binary.
    pub fn infer(&self, model: &str, inputs: &[(&str, &Tensor)], id: Option<&str>) -> Result<InferResult, Error> {
        let mut specs = Vec::new();
        let mut payload = Vec::new();
        for (name, t) in inputs {
            specs.push(json!({
                "name": name,
                "shape": t.shape,
                "datatype": dtype(&t.dtype)?.2,
                "parameters": {"binary_data_size": t.data.len()},
            }));
            payload.extend_from_slice(&t.data);
        }
        let mut header = json!({"inputs": specs, "parameters": {"binary_data_output": true}});
        if let Some(id) = id {
            header["id"] = json!(id);
        }
        let head = header.to_string();
        let mut body = head.clone().into_bytes();
        body.extend_from_slice(&payload);
        let request = self
            .agent
            .request_url("POST", &self.url(["v2", "models", model, "infer"])?)
            .set("Content-Type", "application/octet-stream")
            .set("Inference-Header-Content-Length", &head.len().to_string());
        let r = self.send(request, Some(&body), &["inference-header-content-length"])?;
        parse_infer_response(&r.body, r.header("inference-header-content-length"))
    }
}
