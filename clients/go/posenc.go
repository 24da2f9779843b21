// Package posenc is a client of the posenc service (standard library only): positional-encoding
// tables as safetensors or raw tensors, and KServe v2 inference with binary tensors.
//
//	c := posenc.New("http://127.0.0.1:8000")
//	b, err := c.Table("/v1/rope", url.Values{"max_position": {"8"}, "head_dim": {"64"}})
//	cos, err := b.Tensors["cos"].Float64s() // row-major, shape b.Tensors["cos"].Shape
//
// All wire formats are little-endian; float16 and bfloat16 are kept as raw bits in Tensor.Data
// and widened by Float64s.
package posenc

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DType names the service uses, with their safetensors and KServe v2 spellings and element sizes.
type dtypeInfo struct {
	name, safetensors, kserve string
	size                      int
}

var dtypes = []dtypeInfo{
	{"float64", "F64", "FP64", 8}, {"float32", "F32", "FP32", 4}, {"float16", "F16", "FP16", 2},
	{"bfloat16", "BF16", "BF16", 2}, {"int64", "I64", "INT64", 8}, {"int32", "I32", "INT32", 4},
	{"int16", "I16", "INT16", 2}, {"int8", "I8", "INT8", 1}, {"uint64", "U64", "UINT64", 8},
	{"uint32", "U32", "UINT32", 4}, {"uint16", "U16", "UINT16", 2}, {"uint8", "U8", "UINT8", 1},
	{"bool", "BOOL", "BOOL", 1},
}

func lookup(match func(dtypeInfo) bool) (dtypeInfo, bool) {
	for _, d := range dtypes {
		if match(d) {
			return d, true
		}
	}
	return dtypeInfo{}, false
}

// Tensor is one array: the service's dtype name, its shape and its little-endian bytes (row-major).
type Tensor struct {
	DType string
	Shape []int
	Data  []byte
}

// Len is the number of elements the shape holds.
func (t Tensor) Len() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Float64s widens every element to float64 (float16 and bfloat16 bits decoded, integers converted).
func (t Tensor) Float64s() ([]float64, error) {
	d, ok := lookup(func(d dtypeInfo) bool { return d.name == t.DType })
	if !ok {
		return nil, fmt.Errorf("posenc: unsupported dtype %q", t.DType)
	}
	n := len(t.Data) / d.size
	out := make([]float64, n)
	le := binary.LittleEndian
	for i := 0; i < n; i++ {
		b := t.Data[i*d.size:]
		switch t.DType {
		case "float64":
			out[i] = math.Float64frombits(le.Uint64(b))
		case "float32":
			out[i] = float64(math.Float32frombits(le.Uint32(b)))
		case "float16":
			out[i] = Float16ToFloat64(le.Uint16(b))
		case "bfloat16":
			out[i] = float64(math.Float32frombits(uint32(le.Uint16(b)) << 16))
		case "int64":
			out[i] = float64(int64(le.Uint64(b)))
		case "int32":
			out[i] = float64(int32(le.Uint32(b)))
		case "int16":
			out[i] = float64(int16(le.Uint16(b)))
		case "int8":
			out[i] = float64(int8(b[0]))
		case "uint64":
			out[i] = float64(le.Uint64(b))
		case "uint32":
			out[i] = float64(le.Uint32(b))
		case "uint16":
			out[i] = float64(le.Uint16(b))
		default: // uint8, bool
			out[i] = float64(b[0])
		}
	}
	return out, nil
}

// Int64s returns the elements of an int64 tensor.
func (t Tensor) Int64s() ([]int64, error) {
	if t.DType != "int64" {
		return nil, fmt.Errorf("posenc: Int64s of a %s tensor", t.DType)
	}
	out := make([]int64, len(t.Data)/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	return out, nil
}

// Float16ToFloat64 decodes IEEE 754 half-precision bits (subnormals, infinities and NaN included).
func Float16ToFloat64(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	frac := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * frac * math.Pow(2, -24)
	case 31:
		if frac != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * (1 + frac/1024) * math.Pow(2, float64(exp-15))
}

// Bundle is a decoded safetensors body: every tensor plus the string metadata.
type Bundle struct {
	Tensors  map[string]Tensor
	Metadata map[string]string
}

// Error is an error answer of the service: HTTP status plus the `{"error", "type"}` envelope.
type Error struct {
	Status  int
	Type    string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("posenc: HTTP %d (%s): %s", e.Status, e.Type, e.Message)
}

// Client talks to one posenc server.
type Client struct {
	BaseURL string
	HTTP    *http.Client
}

// New returns a client of the server at baseURL with a 30 s timeout per request.
func New(baseURL string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), HTTP: &http.Client{Timeout: 30 * time.Second}}
}

// do sends the request and returns the 2xx response with its body read, or an *Error.
func (c *Client) do(req *http.Request) (*http.Response, []byte, error) {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode >= 300 {
		e := &Error{Status: resp.StatusCode, Message: string(body)}
		var envelope struct{ Error, Type string }
		if json.Unmarshal(body, &envelope) == nil && envelope.Error != "" {
			e.Message, e.Type = envelope.Error, envelope.Type
		}
		return nil, nil, e
	}
	return resp, body, nil
}

func (c *Client) get(path string, query url.Values) (*http.Response, []byte, error) {
	req, err := http.NewRequest(http.MethodGet, c.BaseURL+path+"?"+query.Encode(), nil)
	if err != nil {
		return nil, nil, err
	}
	return c.do(req)
}

func withFormat(params url.Values, format, tensor string) url.Values {
	q := url.Values{}
	for k, v := range params {
		q[k] = v
	}
	q.Set("format", format)
	if tensor != "" {
		q.Set("tensor", tensor)
	}
	return q
}

// Table GETs a v1 table (e.g. "/v1/rope") as safetensors: every tensor of the bundle.
func (c *Client) Table(path string, params url.Values) (*Bundle, error) {
	_, body, err := c.get(path, withFormat(params, "safetensors", ""))
	if err != nil {
		return nil, err
	}
	return ParseSafetensors(body)
}

// RawTensor GETs one tensor of a v1 table with format=raw; its name comes from X-Tensor-Name.
func (c *Client) RawTensor(path string, params url.Values, tensor string) (string, Tensor, error) {
	resp, body, err := c.get(path, withFormat(params, "raw", tensor))
	if err != nil {
		return "", Tensor{}, err
	}
	t, err := ParseRaw(body, resp.Header.Get("X-Tensor-Dtype"), resp.Header.Get("X-Tensor-Shape"))
	return resp.Header.Get("X-Tensor-Name"), t, err
}

// ParseRaw builds a tensor from a raw body and its X-Tensor-Dtype / X-Tensor-Shape header values.
func ParseRaw(body []byte, dtype, shape string) (Tensor, error) {
	t := Tensor{DType: dtype, Shape: []int{}, Data: body}
	if shape != "" {
		for _, s := range strings.Split(shape, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return Tensor{}, fmt.Errorf("posenc: bad X-Tensor-Shape %q", shape)
			}
			t.Shape = append(t.Shape, n)
		}
	}
	return t, checkSize(t, "raw")
}

func checkSize(t Tensor, what string) error {
	d, ok := lookup(func(d dtypeInfo) bool { return d.name == t.DType })
	if !ok {
		return fmt.Errorf("posenc: %s: unsupported dtype %q", what, t.DType)
	}
	if len(t.Data) != t.Len()*d.size {
		return fmt.Errorf("posenc: %s: %d bytes for shape %v of %s", what, len(t.Data), t.Shape, t.DType)
	}
	return nil
}

// ParseSafetensors decodes a safetensors file: u64 header length, JSON header, data.
func ParseSafetensors(b []byte) (*Bundle, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("posenc: safetensors: %d bytes", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > uint64(len(b)-8) {
		return nil, fmt.Errorf("posenc: safetensors: header runs past the end")
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &header); err != nil {
		return nil, fmt.Errorf("posenc: safetensors header: %w", err)
	}
	data := b[8+n:]
	bundle := &Bundle{Tensors: map[string]Tensor{}, Metadata: map[string]string{}}
	for name, raw := range header {
		if name == "__metadata__" {
			if err := json.Unmarshal(raw, &bundle.Metadata); err != nil {
				return nil, err
			}
			continue
		}
		var info struct {
			DType       string `json:"dtype"`
			Shape       []int  `json:"shape"`
			DataOffsets [2]int `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &info); err != nil {
			return nil, err
		}
		d, ok := lookup(func(d dtypeInfo) bool { return d.safetensors == info.DType })
		begin, end := info.DataOffsets[0], info.DataOffsets[1]
		if !ok || begin < 0 || begin > end || end > len(data) {
			return nil, fmt.Errorf("posenc: safetensors: bad entry %s", name)
		}
		t := Tensor{DType: d.name, Shape: info.Shape, Data: data[begin:end]}
		if err := checkSize(t, name); err != nil {
			return nil, err
		}
		bundle.Tensors[name] = t
	}
	return bundle, nil
}

// InferInput is one named input of an inference request.
type InferInput struct {
	Name   string
	Tensor Tensor
}

// InferResult holds the outputs of one inference, by name.
type InferResult struct {
	ModelName string
	ID        string
	Outputs   map[string]Tensor
}

// Infer runs `model` with the KServe v2 binary tensor extension: a JSON header, then each input's
// bytes, with Inference-Header-Content-Length saying where the header ends; outputs come back binary.
func (c *Client) Infer(model string, inputs []InferInput, id string) (*InferResult, error) {
	type spec struct {
		Name       string         `json:"name"`
		Shape      []int          `json:"shape"`
		DataType   string         `json:"datatype"`
		Parameters map[string]int `json:"parameters"`
	}
	header := struct {
		ID         string          `json:"id,omitempty"`
		Inputs     []spec          `json:"inputs"`
		Parameters map[string]bool `json:"parameters"`
	}{ID: id, Parameters: map[string]bool{"binary_data_output": true}}
	var payload bytes.Buffer
	for _, in := range inputs {
		d, ok := lookup(func(d dtypeInfo) bool { return d.name == in.Tensor.DType })
		if !ok {
			return nil, fmt.Errorf("posenc: input %s: unsupported dtype %q", in.Name, in.Tensor.DType)
		}
		if err := checkSize(in.Tensor, in.Name); err != nil {
			return nil, err
		}
		header.Inputs = append(header.Inputs, spec{in.Name, in.Tensor.Shape, d.kserve,
			map[string]int{"binary_data_size": len(in.Tensor.Data)}})
		payload.Write(in.Tensor.Data)
	}
	head, err := json.Marshal(header)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodPost, c.BaseURL+"/v2/models/"+url.PathEscape(model)+"/infer",
		io.MultiReader(bytes.NewReader(head), &payload))
	if err != nil {
		return nil, err
	}
	req.ContentLength = int64(len(head) + payload.Len())
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Inference-Header-Content-Length", strconv.Itoa(len(head)))
	resp, body, err := c.do(req)
	if err != nil {
		return nil, err
	}
	return ParseInferResponse(body, resp.Header.Get("Inference-Header-Content-Length"))
}

// ParseInferResponse decodes a v2 infer response: JSON only, or a JSON header of headerLength bytes
// followed by the binary outputs in order.
func ParseInferResponse(body []byte, headerLength string) (*InferResult, error) {
	n := len(body)
	if headerLength != "" {
		v, err := strconv.Atoi(headerLength)
		if err != nil || v < 0 || v > len(body) {
			return nil, fmt.Errorf("posenc: bad Inference-Header-Content-Length %q", headerLength)
		}
		n = v
	}
	var doc struct {
		ModelName string `json:"model_name"`
		ID        string `json:"id"`
		Outputs   []struct {
			Name       string            `json:"name"`
			DataType   string            `json:"datatype"`
			Shape      []int             `json:"shape"`
			Parameters map[string]any    `json:"parameters"`
			Data       []json.RawMessage `json:"data"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(body[:n], &doc); err != nil {
		return nil, fmt.Errorf("posenc: infer response header: %w", err)
	}
	result := &InferResult{ModelName: doc.ModelName, ID: doc.ID, Outputs: map[string]Tensor{}}
	offset := n
	for _, out := range doc.Outputs {
		d, ok := lookup(func(d dtypeInfo) bool { return d.kserve == out.DataType })
		size, binaryOut := out.Parameters["binary_data_size"].(float64)
		if !ok || !binaryOut {
			return nil, fmt.Errorf("posenc: output %s: expected a binary %s tensor", out.Name, out.DataType)
		}
		if offset+int(size) > len(body) {
			return nil, fmt.Errorf("posenc: output %s runs past the end of the body", out.Name)
		}
		t := Tensor{DType: d.name, Shape: out.Shape, Data: body[offset : offset+int(size)]}
		offset += int(size)
		if err := checkSize(t, out.Name); err != nil {
			return nil, err
		}
		result.Outputs[out.Name] = t
	}
	return result, nil
}

// Names returns the tensor names of a bundle, sorted.
func (b *Bundle) Names() []string {
	names := make([]string, 0, len(b.Tensors))
	for n := range b.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
