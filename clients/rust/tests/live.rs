//! Tests against a live posenc server:
//!
//!     POSENC_URL=http://127.0.0.1:8000 POSENC_FIXTURES=fixtures.json cargo test --offline
//!
//! POSENC_FIXTURES is written by scripts/client_fixtures.py (tables computed by the service
//! in-process, inference outputs by onnxruntime run on the model file); scripts/clients-test.sh
//! does all of it.

use posenc_client::{bf16_to_f64, f16_to_f64, Client, Error, Tensor, DTYPES};
use serde_json::Value;

fn env(name: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("set POSENC_URL (a running server) and POSENC_FIXTURES (scripts/client_fixtures.py output)"))
}

fn client() -> Client {
    Client::new(&env("POSENC_URL"))
}

fn fixtures() -> Value {
    serde_json::from_str(&std::fs::read_to_string(env("POSENC_FIXTURES")).unwrap()).unwrap()
}

fn fixture_tensor(doc: &Value) -> Tensor {
    let shape = doc["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
    Tensor::new(doc["dtype"].as_str().unwrap(), shape, base64::decode(doc["b64"].as_str().unwrap()).unwrap()).unwrap()
}

const ROPE: [(&str, &str); 2] = [("max_position", "4"), ("head_dim", "8")];

#[test]
fn rope_safetensors_cos_of_one() {
    let b = client().table("/v1/rope", &ROPE).unwrap();
    assert_eq!(b.tensors.keys().collect::<Vec<_>>(), ["cos", "inv_freq", "sin"]);
    let cos = &b.tensors["cos"];
    assert_eq!((cos.dtype.as_str(), &cos.shape[..]), ("float32", &[4, 8][..]));
    let v = cos.to_f64().unwrap()[8];
    assert!((v - 1f64.cos()).abs() < 1e-6, "cos[1,0] = {}", v);
    assert!(!b.metadata["posenc_version"].is_empty());
}

#[test]
fn rope_raw_float16_and_bfloat16() {
    for (dtype, tol) in [("float16", 1e-3), ("bfloat16", 4e-3)] {
        let mut params = ROPE.to_vec();
        params.push(("dtype", dtype));
        let (name, cos) = client().raw_tensor("/v1/rope", &params, Some("cos")).unwrap();
        assert_eq!((name.as_str(), cos.dtype.as_str(), &cos.shape[..]), ("cos", dtype, &[4, 8][..]));
        let v = cos.to_f64().unwrap()[8];
        assert!((v - 1f64.cos()).abs() < tol && v != 1f64.cos() as f32 as f64, "{} cos[1,0] = {}", dtype, v);
    }
}

#[test]
fn alibi_slopes_and_t5_buckets() {
    let c = client();
    let s = c.table("/v1/alibi/slopes", &[("num_heads", "8")]).unwrap().tensors["slopes"].to_f64().unwrap();
    assert_eq!((s.len(), s[0], s[1], s[7]), (8, 0.5, 0.25, 1.0 / 256.0));
    let (name, b) = c.raw_tensor("/v1/t5/buckets", &[("query_length", "4"), ("key_length", "6")], None).unwrap();
    let v = b.to_i64().unwrap();
    // bidirectional, 32 buckets: key after query -> 16 + distance, before -> distance.
    assert_eq!((name.as_str(), v[0], v[1], v[6], v[3 * 6 + 5]), ("buckets", 0, 17, 1, 18));
}

#[test]
fn fixture_tables_byte_for_byte() {
    let (c, f) = (client(), fixtures());
    let cases = f["tables"].as_array().unwrap();
    assert!(cases.len() >= 10, "only {} table cases", cases.len());
    for case in cases {
        let endpoint = case["endpoint"].as_str().unwrap();
        let params: Vec<(&str, &str)> =
            case["params"].as_object().unwrap().iter().map(|(k, v)| (k.as_str(), v.as_str().unwrap())).collect();
        let bundle = c.table(endpoint, &params).unwrap();
        let tensors = case["tensors"].as_object().unwrap();
        assert_eq!(bundle.tensors.len(), tensors.len(), "{}", endpoint);
        for (name, doc) in tensors {
            let want = fixture_tensor(doc);
            assert!(bundle.tensors[name] == want, "safetensors {} {}", endpoint, name);
            let (raw_name, raw) = c.raw_tensor(endpoint, &params, Some(name)).unwrap();
            assert!(raw_name == *name && raw == want, "raw {} {}", endpoint, name);
        }
    }
}

#[test]
fn a_4xx_is_a_service_error_with_the_message() {
    let c = client();
    match c.table("/v1/sinusoidal", &[("max_position", "0"), ("dim", "8")]) {
        Err(Error::Service { status, kind, message }) => {
            assert_eq!((status, kind.as_str()), (422, "invalid_parameter"));
            assert!(message.contains("max_position"), "{}", message);
        }
        other => panic!("expected a service error, got {:?}", other.map(|b| b.metadata)),
    }
    let x = Tensor::new("float32", vec![1], vec![0; 4]).unwrap();
    match c.infer("no_such_model", &[("x", &x)], None) {
        Err(Error::Service { status: 404, .. }) => {}
        other => panic!("expected 404, got {:?}", other.map(|r| r.model_name)),
    }
}

#[test]
fn kserve_binary_infer_equals_onnxruntime() {
    let f = fixtures();
    let case = f.get("infer").filter(|c| !c.is_null()).expect("the fixtures hold an inference case");
    let inputs: Vec<(String, Tensor)> =
        case["inputs"].as_object().unwrap().iter().map(|(k, doc)| (k.clone(), fixture_tensor(doc))).collect();
    let refs: Vec<(&str, &Tensor)> = inputs.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let model = case["model"].as_str().unwrap();
    let result = client().infer(model, &refs, Some("rust-client-test")).unwrap();
    let outputs = case["outputs"].as_object().unwrap();
    assert_eq!((result.id.as_str(), result.outputs.len()), ("rust-client-test", outputs.len()));
    for (name, doc) in outputs {
        let want = fixture_tensor(doc);
        let got = &result.outputs[name];
        assert_eq!((&got.dtype, &got.shape), (&want.dtype, &want.shape));
        let (g, w) = (got.to_f64().unwrap(), want.to_f64().unwrap());
        let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        // Same runtime and inputs; batching may change the summation order a little, never more.
        assert!(worst <= 1e-5, "{}: max abs difference {}", name, worst);
    }
}

#[test]
fn half_precision_decoding() {
    assert_eq!((f16_to_f64(0x3c00), f16_to_f64(0xc000), f16_to_f64(0x0001)), (1.0, -2.0, 2f64.powi(-24)));
    assert_eq!(f16_to_f64(0xfc00), f64::NEG_INFINITY);
    assert_eq!((bf16_to_f64(0x3f80), bf16_to_f64(0xc0a0)), (1.0, -5.0));
}

#[test]
fn dtype_table_matches_models_dtypes() {
    // The client's table against models/dtypes.py (the fixtures' `dtypes`): a dtype added or renamed there fails here.
    let f = fixtures();
    let want: std::collections::BTreeMap<&str, (&str, &str, usize)> = f["dtypes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let text = |k: &str| d[k].as_str().unwrap();
            (text("name"), (text("safetensors"), text("kserve"), d["size"].as_u64().unwrap() as usize))
        })
        .collect();
    let ours = DTYPES.iter().map(|(n, st, kv, size)| (*n, (*st, *kv, *size))).collect();
    assert!(want.len() >= 13, "only {} dtypes in the fixtures", want.len());
    assert_eq!(want, ours);
}

#[test]
fn a_bad_base_url_is_a_transport_error() {
    for url in ["not a url", "mailto:x@example.org"] {
        match Client::new(url).table("/v1/rope", &ROPE) {
            Err(Error::Transport(m)) => assert!(m.contains(url), "{}", m),
            other => panic!("{}: expected a transport error, got {:?}", url, other.map(|b| b.metadata)),
        }
    }
}
