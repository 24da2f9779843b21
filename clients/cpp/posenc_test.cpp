// Tests of the C++ client against a live posenc server:
//
//   POSENC_URL=http://127.0.0.1:8000 POSENC_FIXTURES=fixtures.json ./posenc_test
//
// POSENC_FIXTURES is written by scripts/client_fixtures.py (tables computed by the service
// in-process, inference outputs by onnxruntime run on the model file); scripts/clients-test.sh
// does all of it. Prints one line per test and "N passed, N failed"; exits non-zero on any failure.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "posenc.hpp"

namespace {

using json = nlohmann::json;

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(bool ok, const std::string& what) {
  if (!ok) throw Failure(what);
}

std::vector<uint8_t> base64_decode(const std::string& in) {
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else continue;  // '=' padding
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>((acc >> bits) & 0xff));
    }
  }
  return out;
}

posenc::Tensor fixture_tensor(const json& doc) {
  return {doc.at("dtype").get<std::string>(), doc.at("shape").get<std::vector<int64_t>>(),
          base64_decode(doc.at("b64").get<std::string>())};
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    std::cerr << "set POSENC_URL (a running server) and POSENC_FIXTURES (scripts/client_fixtures.py output)\n";
    std::exit(2);
  }
  return v;
}

bool same(const posenc::Tensor& a, const posenc::Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.data == b.data;
}

}  // namespace

int main() {
  const posenc::Client client(env("POSENC_URL"));
  std::ifstream file(env("POSENC_FIXTURES"));
  const json fixtures = json::parse(file);
  const posenc::Params rope{{"max_position", "4"}, {"head_dim", "8"}};

  std::vector<std::pair<std::string, std::function<void()>>> tests = {
      {"rope safetensors: cos(1) at row 1, col 0",
       [&] {
         posenc::Bundle b = client.table("/v1/rope", rope);
         check(b.tensors.size() == 3 && b.tensors.count("inv_freq") == 1, "tensors cos, sin, inv_freq");
         const posenc::Tensor& cos = b.tensors.at("cos");
         check(cos.dtype == "float32" && cos.shape == std::vector<int64_t>{4, 8}, "cos float32 [4, 8]");
         check(std::fabs(cos.to_double()[8] - std::cos(1.0)) < 1e-6, "cos[1,0] == cos(1)");
         check(!b.metadata.at("posenc_version").empty(), "metadata posenc_version");
       }},
      {"rope raw float16 and bfloat16",
       [&] {
         for (const auto& [dtype, tol] : {std::pair{"float16", 1e-3}, std::pair{"bfloat16", 4e-3}}) {
           posenc::Params p = rope;
           p.emplace_back("dtype", dtype);
           posenc::NamedTensor t = client.raw_tensor("/v1/rope", p, "cos");
           check(t.name == "cos" && t.tensor.dtype == dtype && t.tensor.shape == std::vector<int64_t>{4, 8},
                 std::string("raw header of ") + dtype);
           const double v = t.tensor.to_double()[8];
           check(std::fabs(v - std::cos(1.0)) < tol && v != static_cast<double>(static_cast<float>(std::cos(1.0))),
                 std::string("cos[1,0] rounded to ") + dtype);
         }
       }},
      {"alibi slopes and t5 buckets",
       [&] {
         const std::vector<double> s = client.table("/v1/alibi/slopes", {{"num_heads", "8"}}).tensors.at("slopes").to_double();
         check(s.size() == 8 && s[0] == 0.5 && s[1] == 0.25 && s[7] == 1.0 / 256, "slopes 2^-(8h/H)");
         posenc::NamedTensor b = client.raw_tensor("/v1/t5/buckets", {{"query_length", "4"}, {"key_length", "6"}});
         const std::vector<int64_t> v = b.tensor.to_int64();
         // bidirectional, 32 buckets: key after query -> 16 + distance, before -> distance.
         check(b.name == "buckets" && v[0] == 0 && v[1] == 17 && v[6] == 1 && v[3 * 6 + 5] == 18, "t5 buckets");
       }},
      {"the dtype table matches models/dtypes.py",
       [&] {
         // name -> (safetensors, kserve, size), from the client and from the fixtures' `dtypes`.
         using Row = std::tuple<std::string, std::string, size_t>;
         std::map<std::string, Row> ours, want;
         for (const posenc::DType& d : posenc::dtypes()) ours[d.name] = Row{d.safetensors, d.kserve, d.size};
         for (const json& d : fixtures.at("dtypes")) {
           want[d.at("name").get<std::string>()] =
               Row{d.at("safetensors").get<std::string>(), d.at("kserve").get<std::string>(), d.at("size").get<size_t>()};
         }
         check(want.size() >= 13, "at least 13 dtypes in the fixtures");
         check(ours == want, "the client's dtype table equals models/dtypes.py's");
       }},
      {"fixture tables byte for byte (safetensors and raw)",
       [&] {
         check(fixtures.at("tables").size() >= 10, "at least 10 table cases in the fixtures");
         for (const json& c : fixtures.at("tables")) {
           posenc::Params p;
           for (const auto& [k, v] : c.at("params").items()) p.emplace_back(k, v.get<std::string>());
           const std::string endpoint = c.at("endpoint").get<std::string>();
           posenc::Bundle b = client.table(endpoint, p);
           check(b.tensors.size() == c.at("tensors").size(), endpoint + ": tensor count");
           for (const auto& [name, doc] : c.at("tensors").items()) {
             const posenc::Tensor want = fixture_tensor(doc);
             check(same(b.tensors.at(name), want), "safetensors " + endpoint + " " + name);
             posenc::NamedTensor raw = client.raw_tensor(endpoint, p, name);
             check(raw.name == name && same(raw.tensor, want), "raw " + endpoint + " " + name);
           }
         }
       }},
      {"a 4xx is posenc::Error with the service's message",
       [&] {
         try {
           client.table("/v1/sinusoidal", {{"max_position", "0"}, {"dim", "8"}});
           check(false, "no exception");
         } catch (const posenc::Error& e) {
           check(e.status() == 422 && e.type() == "invalid_parameter", "422 invalid_parameter");
           check(e.message().find("max_position") != std::string::npos, "message names max_position");
         }
         try {
           client.infer("no_such_model", {{"x", posenc::Tensor{"float32", {1}, std::vector<uint8_t>(4)}}});
           check(false, "no exception");
         } catch (const posenc::Error& e) {
           check(e.status() == 404, "unknown model is 404");
         }
       }},
      {"KServe v2 binary infer equals onnxruntime",
       [&] {
         const json& c = fixtures.at("infer");
         check(c.is_object(), "the fixtures hold an inference case (a model in onnx/)");
         std::map<std::string, posenc::Tensor> inputs;
         for (const auto& [name, doc] : c.at("inputs").items()) inputs.emplace(name, fixture_tensor(doc));
         posenc::InferResult r = client.infer(c.at("model").get<std::string>(), inputs, "cpp-client-test");
         check(r.id == "cpp-client-test" && r.outputs.size() == c.at("outputs").size(), "id and outputs");
         for (const auto& [name, doc] : c.at("outputs").items()) {
           const posenc::Tensor want = fixture_tensor(doc);
           const posenc::Tensor& got = r.outputs.at(name);
           check(got.dtype == want.dtype && got.shape == want.shape, name + ": dtype and shape");
           const std::vector<double> g = got.to_double(), w = want.to_double();
           double worst = 0;
           for (size_t i = 0; i < w.size(); ++i) worst = std::max(worst, std::fabs(g[i] - w[i]));
           // Same runtime and inputs; batching may change the summation order a little, never more.
           check(worst <= 1e-5, name + ": max abs difference " + std::to_string(worst));
         }
       }},
      {"float16 and bfloat16 decoding",
       [&] {
         check(posenc::float16_to_double(0x3c00) == 1 && posenc::float16_to_double(0xc000) == -2, "f16 1, -2");
         check(posenc::float16_to_double(0x0001) == std::ldexp(1.0, -24), "f16 subnormal");
         check(std::isinf(posenc::float16_to_double(0xfc00)) && posenc::float16_to_double(0xfc00) < 0, "f16 -inf");
         check(posenc::bfloat16_to_double(0x3f80) == 1 && posenc::bfloat16_to_double(0xc0a0) == -5, "bf16 1, -5");
       }},
  };

  int passed = 0, failed = 0;
  for (const auto& [name, body] : tests) {
    try {
      body();
      ++passed;
      std::cout << "ok   " << name << "\n";
    } catch (const std::exception& e) {
      ++failed;
      std::cout << "FAIL " << name << ": " << e.what() << "\n";
    }
  }
  std::cout << passed << " passed, " << failed << " failed\n";
  return failed == 0 ? 0 : 1;
}
