// posenc C++17 client (see posenc.hpp).
#include "posenc.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

namespace posenc {
namespace {

using json = nlohmann::json;

constexpr DType kDTypes[] = {
    {"float64", "F64", "FP64", 8}, {"float32", "F32", "FP32", 4}, {"float16", "F16", "FP16", 2},
    {"bfloat16", "BF16", "BF16", 2}, {"int64", "I64", "INT64", 8}, {"int32", "I32", "INT32", 4},
    {"int16", "I16", "INT16", 2},  {"int8", "I8", "INT8", 1},     {"uint64", "U64", "UINT64", 8},
    {"uint32", "U32", "UINT32", 4}, {"uint16", "U16", "UINT16", 2}, {"uint8", "U8", "UINT8", 1},
    {"bool", "BOOL", "BOOL", 1},
};

template <typename Match>
const DType& find_dtype(Match match, const std::string& what) {
  for (const DType& d : kDTypes) {
    if (match(d)) return d;
  }
  throw std::runtime_error("posenc: unsupported dtype " + what);
}

const DType& by_name(const std::string& n) {
  return find_dtype([&](const DType& d) { return n == d.name; }, n);
}

bool little_endian_host() {
  const uint16_t one = 1;
  uint8_t first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

template <typename T>
T load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof value);  // unaligned-safe; the wire is little-endian like the host
  return value;
}

void check_size(const Tensor& t, const std::string& what) {
  if (t.data.size() != static_cast<size_t>(t.size()) * by_name(t.dtype).size) {
    throw std::runtime_error("posenc: " + what + ": " + std::to_string(t.data.size()) +
                             " bytes do not match its shape and dtype " + t.dtype);
  }
}

struct HttpResponse {
  long status = 0;
  std::vector<uint8_t> body;
  std::map<std::string, std::string> headers;  // lower-case names
};

size_t on_body(char* data, size_t size, size_t count, void* out) {
  auto* body = static_cast<std::vector<uint8_t>*>(out);
  body->insert(body->end(), data, data + size * count);
  return size * count;
}

size_t on_header(char* data, size_t size, size_t count, void* out) {
  std::string line(data, size * count);
  auto colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t\r\n") + 1);
    (*static_cast<std::map<std::string, std::string>*>(out))[name] = value;
  }
  return size * count;
}

struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
  ~CurlGlobal() { curl_global_cleanup(); }
};

/// One request; a 4xx/5xx becomes posenc::Error with the envelope's message and type.
HttpResponse send(const std::string& url, long timeout, const std::vector<uint8_t>* post_body,
                  const std::vector<std::string>& extra_headers) {
  static CurlGlobal global;
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) throw std::runtime_error("posenc: curl_easy_init failed");
  HttpResponse r;
  curl_slist* headers = nullptr;
  for (const auto& h : extra_headers) headers = curl_slist_append(headers, h.c_str());
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> header_list(headers, curl_slist_free_all);
  CURL* h = curl.get();
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_TIMEOUT, timeout);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &r.headers);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  if (post_body != nullptr) {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, post_body->data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(post_body->size()));
  }
  CURLcode rc = curl_easy_perform(h);
  if (rc != CURLE_OK) throw std::runtime_error(std::string("posenc: ") + curl_easy_strerror(rc) + ": " + url);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
  if (r.status >= 300) {
    std::string text(r.body.begin(), r.body.end());
    json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_object() && doc.contains("error") && doc["error"].is_string()) {
      throw Error(r.status, doc.value("type", ""), doc["error"].get<std::string>());
    }
    throw Error(r.status, "", text);
  }
  return r;
}

std::string escape(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string query(const Params& params) {
  std::string q;
  for (const auto& [k, v] : params) q += (q.empty() ? "?" : "&") + escape(k) + "=" + escape(v);
  return q;
}

std::vector<int64_t> shape_of(const json& j) { return j.get<std::vector<int64_t>>(); }

}  // namespace

Error::Error(long status, std::string type, const std::string& message)
    : std::runtime_error("posenc: HTTP " + std::to_string(status) + " (" + type + "): " + message),
      status_(status), type_(std::move(type)), message_(message) {}

int64_t Tensor::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

double float16_to_double(uint16_t h) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const int exp = (h >> 10) & 0x1f;
  const double frac = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(frac, -24);
  if (exp == 31) return frac != 0 ? std::nan("") : sign * INFINITY;
  return sign * std::ldexp(1.0 + frac / 1024.0, exp - 15);
}

double bfloat16_to_double(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

std::vector<double> Tensor::to_double() const {
  if (!little_endian_host()) throw std::runtime_error("posenc: big-endian hosts are not supported");
  const DType& d = by_name(dtype);
  const size_t n = data.size() / d.size;
  std::vector<double> out(n);
  const std::string name = d.name;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = data.data() + i * d.size;
    if (name == "float64") out[i] = load<double>(p);
    else if (name == "float32") out[i] = load<float>(p);
    else if (name == "float16") out[i] = float16_to_double(load<uint16_t>(p));
    else if (name == "bfloat16") out[i] = bfloat16_to_double(load<uint16_t>(p));
    else if (name == "int64") out[i] = static_cast<double>(load<int64_t>(p));
    else if (name == "int32") out[i] = load<int32_t>(p);
    else if (name == "int16") out[i] = load<int16_t>(p);
    else if (name == "int8") out[i] = load<int8_t>(p);
    else if (name == "uint64") out[i] = static_cast<double>(load<uint64_t>(p));
    else if (name == "uint32") out[i] = load<uint32_t>(p);
    else if (name == "uint16") out[i] = load<uint16_t>(p);
    else out[i] = *p;  // uint8, bool
  }
  return out;
}

std::vector<int64_t> Tensor::to_int64() const {
  if (dtype != "int64") throw std::runtime_error("posenc: to_int64 of a " + dtype + " tensor");
  std::vector<int64_t> out(data.size() / 8);
  for (size_t i = 0; i < out.size(); ++i) out[i] = load<int64_t>(data.data() + 8 * i);
  return out;
}

std::vector<DType> dtypes() { return {std::begin(kDTypes), std::end(kDTypes)}; }

Bundle parse_safetensors(const std::vector<uint8_t>& bytes) {
  if (bytes.size() < 8) throw std::runtime_error("posenc: safetensors: too short");
  const uint64_t n = load<uint64_t>(bytes.data());
  if (n > bytes.size() - 8) throw std::runtime_error("posenc: safetensors: header runs past the end");
  const json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  const size_t base = 8 + n;
  Bundle bundle;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      bundle.metadata = info.get<std::map<std::string, std::string>>();
      continue;
    }
    const std::string st = info.at("dtype").get<std::string>();
    const DType& d = find_dtype([&](const DType& x) { return st == x.safetensors; }, st);
    const auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
    if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > bytes.size() - base) {
      throw std::runtime_error("posenc: safetensors: bad data_offsets of " + name);
    }
    Tensor t{d.name, shape_of(info.at("shape")),
             std::vector<uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(base + offsets[0]),
                                  bytes.begin() + static_cast<std::ptrdiff_t>(base + offsets[1]))};
    check_size(t, name);
    bundle.tensors.emplace(name, std::move(t));
  }
  return bundle;
}

Tensor parse_raw(std::vector<uint8_t> body, const std::string& dtype, const std::string& shape) {
  Tensor t{dtype, {}, std::move(body)};
  size_t start = 0;
  while (start < shape.size()) {
    size_t comma = shape.find(',', start);
    if (comma == std::string::npos) comma = shape.size();
    t.shape.push_back(std::stoll(shape.substr(start, comma - start)));
    start = comma + 1;
  }
  check_size(t, "raw");
  return t;
}

InferResult parse_infer_response(const std::vector<uint8_t>& body, const std::string& header_length) {
  const size_t n = header_length.empty() ? body.size() : std::stoull(header_length);
  if (n > body.size()) throw std::runtime_error("posenc: Inference-Header-Content-Length past the body");
  const json doc = json::parse(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(n));
  InferResult result{doc.value("model_name", ""), doc.value("id", ""), {}};
  size_t offset = n;
  for (const json& out : doc.at("outputs")) {
    const std::string datatype = out.at("datatype").get<std::string>();
    const DType& d = find_dtype([&](const DType& x) { return datatype == x.kserve; }, datatype);
    const size_t size = out.at("parameters").at("binary_data_size").get<size_t>();
    if (size > body.size() - offset) throw std::runtime_error("posenc: output past the end of the body");
    Tensor t{d.name, shape_of(out.at("shape")),
             std::vector<uint8_t>(body.begin() + static_cast<std::ptrdiff_t>(offset),
                                  body.begin() + static_cast<std::ptrdiff_t>(offset + size))};
    offset += size;
    check_size(t, out.at("name").get<std::string>());
    result.outputs.emplace(out.at("name").get<std::string>(), std::move(t));
  }
  return result;
}

Client::Client(std::string base_url, long timeout_seconds)
    : base_url_(std::move(base_url)), timeout_seconds_(timeout_seconds) {
  while (!base_url_.empty() && base_url_.back() == '/') base_url_.pop_back();
}

Bundle Client::table(const std::string& path, const Params& params) const {
  Params p = params;
  p.emplace_back("format", "safetensors");
  return parse_safetensors(send(base_url_ + path + query(p), timeout_seconds_, nullptr, {}).body);
}

NamedTensor Client::raw_tensor(const std::string& path, Params params, const std::string& tensor) const {
  params.emplace_back("format", "raw");
  if (!tensor.empty()) params.emplace_back("tensor", tensor);
  HttpResponse r = send(base_url_ + path + query(params), timeout_seconds_, nullptr, {});
  return {r.headers["x-tensor-name"], parse_raw(std::move(r.body), r.headers["x-tensor-dtype"],
                                                r.headers["x-tensor-shape"])};
}

InferResult Client::infer(const std::string& model, const std::map<std::string, Tensor>& inputs,
                          const std::string& id) const {
  json header = {{"inputs", json::array()}, {"parameters", {{"binary_data_output", true}}}};
  if (!id.empty()) header["id"] = id;
  std::vector<uint8_t> payload;
  for (const auto& [name, t] : inputs) {
    check_size(t, name);
    header["inputs"].push_back({{"name", name},
                                {"shape", t.shape},
                                {"datatype", by_name(t.dtype).kserve},
                                {"parameters", {{"binary_data_size", t.data.size()}}}});
    payload.insert(payload.end(), t.data.begin(), t.data.end());
  }
  const std::string head = header.dump();
  std::vector<uint8_t> body(head.begin(), head.end());
  body.insert(body.end(), payload.begin(), payload.end());
  HttpResponse r = send(base_url_ + "/v2/models/" + escape(model) + "/infer", timeout_seconds_, &body,
                        {"Content-Type: application/octet-stream",
                         "Inference-Header-Content-Length: " + std::to_string(head.size())});
  return parse_infer_response(r.body, r.headers["inference-header-content-length"]);
}

}  // namespace posenc
