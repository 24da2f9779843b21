//! Tests against a live posenc server:
//!
//!     POSENC_URL=http://127.0.0.1:8000 POSENC_FIXTURES=fixtures.json cargo test --offline
//!
//! POSENC_FIXTURES is written by scripts/client_fixtures.py (tables computed by the service
//! in-process, inference outputs by onnxruntime run on the model file); scripts/clients-test.sh
//! does all of it.

use posenc_client::{bf16_to_f64, f16_to_f64, Client, Error, Json, Tensor};

fn env(name: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("set POSENC_URL (a running server) and POSENC_FIXTURES (scripts/client_fixtures.py output)"))
}

fn client() -> Client {
    Client::new(&env("POSENC_URL"))
}

fn fixtures() -> Json {
    Json::parse(&std::fs::read_to_string(env("POSENC_FIXTURES")).unwrap()).unwrap()
}

fn base64_decode(text: &str) -> Vec<u8> {
    let (mut acc, mut bits, mut out) = (0u32, 0, Vec::new());
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => continue, // '=' padding
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

fn fixture_tensor(doc: &Json) -> Tensor {
    let dtype = doc.get("dtype").and_then(Json::as_str).unwrap();
    let shape = doc.get("shape").and_then(Json::as_usizes).unwrap();
    Tensor::new(dtype, shape, base64_decode(doc.get("b64").and_then(Json::as_str).unwrap())).unwrap()
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
    let cases = f.get("tables").and_then(Json::as_array).unwrap();
    assert!(cases.len() >= 10, "only {} table cases", cases.len());
    for case in cases {
        let endpoint = case.get("endpoint").and_then(Json::as_str).unwrap();
        let params: Vec<(&str, &str)> = case
            .get("params")
            .and_then(Json::as_object)
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
            .collect();
        let bundle = c.table(endpoint, &params).unwrap();
        let tensors = case.get("tensors").and_then(Json::as_object).unwrap();
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
    let case = f.get("infer").filter(|c| **c != Json::Null).expect("the fixtures hold an inference case");
    let inputs: Vec<(String, Tensor)> = case
        .get("inputs")
        .and_then(Json::as_object)
        .unwrap()
        .iter()
        .map(|(k, doc)| (k.clone(), fixture_tensor(doc)))
        .collect();
    let refs: Vec<(&str, &Tensor)> = inputs.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let model = case.get("model").and_then(Json::as_str).unwrap();
    let result = client().infer(model, &refs, Some("rust-client-test")).unwrap();
    let outputs = case.get("outputs").and_then(Json::as_object).unwrap();
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
fn half_precision_decoding_and_json() {
    assert_eq!((f16_to_f64(0x3c00), f16_to_f64(0xc000), f16_to_f64(0x0001)), (1.0, -2.0, 2f64.powi(-24)));
    assert_eq!(f16_to_f64(0xfc00), f64::NEG_INFINITY);
    assert_eq!((bf16_to_f64(0x3f80), bf16_to_f64(0xc0a0)), (1.0, -5.0));
    let doc = Json::parse(r#"{"a": [1, -2.5e1, "x\u0041", true, null]}"#).unwrap();
    assert_eq!(doc.dump(), r#"{"a":[1,-25,"xA",true,null]}"#);
}
