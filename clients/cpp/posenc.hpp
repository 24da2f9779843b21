// posenc C++17 client: positional-encoding tables (safetensors, raw) and KServe v2 binary inference.
//
//   posenc::Client client("http://127.0.0.1:8000");
//   posenc::Bundle b = client.table("/v1/rope", {{"max_position", "8"}, {"head_dim", "64"}});
//   std::vector<double> cos = b.tensors.at("cos").to_double();   // row-major, shape b.tensors.at("cos").shape
//
// All wire formats are little-endian (checked at run time); float16/bfloat16 stay raw bits in
// Tensor::data and are widened by to_double(). Errors of the service throw posenc::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace posenc {

/// One array: the service's dtype name ("float32", "bfloat16", "int64", ...), shape, little-endian bytes.
struct Tensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  /// Number of elements the shape holds.
  int64_t size() const;
  /// Every element as double (float16/bfloat16 bits decoded, integers converted).
  std::vector<double> to_double() const;
  /// The elements of an int64 tensor.
  std::vector<int64_t> to_int64() const;
};

/// A decoded safetensors body: tensors by name plus the string metadata.
struct Bundle {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// A tensor from format=raw: the X-Tensor-Name header plus the tensor.
struct NamedTensor {
  std::string name;
  Tensor tensor;
};

/// Outputs of one KServe v2 inference.
struct InferResult {
  std::string model_name;
  std::string id;
  std::map<std::string, Tensor> outputs;
};

/// An error answer of the service: HTTP status and the {"error", "type"} envelope.
class Error : public std::runtime_error {
 public:
  Error(long status, std::string type, const std::string& message);
  long status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& message() const { return message_; }

 private:
  long status_;
  std::string type_;
  std::string message_;
};

using Params = std::vector<std::pair<std::string, std::string>>;

/// Client of one posenc server (one libcurl easy handle per request; safe to share between threads).
class Client {
 public:
  explicit Client(std::string base_url, long timeout_seconds = 30);

  /// GET a v1 table (e.g. "/v1/rope") as safetensors: every tensor of the bundle.
  Bundle table(const std::string& path, const Params& params) const;
  /// GET one tensor of a v1 table with format=raw (tensor may be empty for one-tensor tables).
  NamedTensor raw_tensor(const std::string& path, Params params, const std::string& tensor = "") const;
  /// Run `model` with binary tensors (JSON header + bytes, Inference-Header-Content-Length).
  InferResult infer(const std::string& model, const std::map<std::string, Tensor>& inputs,
                    const std::string& id = "") const;

 private:
  std::string base_url_;
  long timeout_seconds_;
};

/// One element type: the service's name, its safetensors code, KServe v2 datatype and size in bytes.
struct DType {
  const char* name;
  const char* safetensors;
  const char* kserve;
  size_t size;
};
/// Every element type the client decodes (the table models/dtypes.py defines on the service side).
std::vector<DType> dtypes();

/// Decoders for bytes obtained elsewhere (files, other HTTP clients).
Bundle parse_safetensors(const std::vector<uint8_t>& bytes);
Tensor parse_raw(std::vector<uint8_t> body, const std::string& dtype, const std::string& shape);
InferResult parse_infer_response(const std::vector<uint8_t>& body, const std::string& header_length);
/// IEEE 754 half precision and bfloat16 bits to double.
double float16_to_double(uint16_t bits);
double bfloat16_to_double(uint16_t bits);

}  // namespace posenc
