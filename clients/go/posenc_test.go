// Tests against a live posenc server:
//
//	POSENC_URL=http://127.0.0.1:8000 POSENC_FIXTURES=/tmp/fixtures.json go test ./...
//
// POSENC_FIXTURES is written by scripts/client_fixtures.py (tables computed by the service
// in-process, inference outputs by onnxruntime run on the model file); scripts/clients-test.sh
// does all of it.
package posenc

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"net/url"
	"os"
	"reflect"
	"strings"
	"testing"
)

type fixtureTensor struct {
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
	B64   string `json:"b64"`
}

// One row of models/dtypes.py, as scripts/client_fixtures.py writes it.
type fixtureDType struct {
	Name        string `json:"name"`
	Safetensors string `json:"safetensors"`
	KServe      string `json:"kserve"`
	Size        int    `json:"size"`
}

type fixtures struct {
	DTypes []fixtureDType `json:"dtypes"`
	Tables []struct {
		Endpoint string                   `json:"endpoint"`
		Params   map[string]string        `json:"params"`
		Tensors  map[string]fixtureTensor `json:"tensors"`
	} `json:"tables"`
	Infer *struct {
		Model   string                   `json:"model"`
		Inputs  map[string]fixtureTensor `json:"inputs"`
		Outputs map[string]fixtureTensor `json:"outputs"`
	} `json:"infer"`
}

func setup(t *testing.T) (*Client, *fixtures) {
	t.Helper()
	base, path := os.Getenv("POSENC_URL"), os.Getenv("POSENC_FIXTURES")
	if base == "" || path == "" {
		t.Fatal("set POSENC_URL (a running server) and POSENC_FIXTURES (scripts/client_fixtures.py output)")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f fixtures
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	return New(base), &f
}

func (f fixtureTensor) tensor(t *testing.T) Tensor {
	data, err := base64.StdEncoding.DecodeString(f.B64)
	if err != nil {
		t.Fatal(err)
	}
	return Tensor{DType: f.DType, Shape: f.Shape, Data: data}
}

func values(t *testing.T, x Tensor) []float64 {
	t.Helper()
	v, err := x.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func params(kv ...string) url.Values {
	q := url.Values{}
	for i := 0; i < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	return q
}

func TestRopeSafetensorsKnownValues(t *testing.T) {
	c, _ := setup(t)
	b, err := c.Table("/v1/rope", params("max_position", "4", "head_dim", "8"))
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Names(); !reflect.DeepEqual(got, []string{"cos", "inv_freq", "sin"}) {
		t.Fatalf("tensors %v", got)
	}
	cos := b.Tensors["cos"]
	if cos.DType != "float32" || !reflect.DeepEqual(cos.Shape, []int{4, 8}) {
		t.Fatalf("cos %s %v", cos.DType, cos.Shape)
	}
	if v := values(t, cos)[8]; math.Abs(v-math.Cos(1)) > 1e-6 {
		t.Fatalf("cos[1,0] = %v, want cos(1)", v)
	}
	if b.Metadata["posenc_version"] == "" {
		t.Fatalf("metadata %v", b.Metadata)
	}
}

func TestRawHalfPrecisionKnownValues(t *testing.T) {
	c, _ := setup(t)
	for dtype, tol := range map[string]float64{"float16": 1e-3, "bfloat16": 4e-3} {
		name, cos, err := c.RawTensor("/v1/rope", params("max_position", "4", "head_dim", "8", "dtype", dtype), "cos")
		if err != nil {
			t.Fatal(err)
		}
		if name != "cos" || cos.DType != dtype || !reflect.DeepEqual(cos.Shape, []int{4, 8}) {
			t.Fatalf("%s: %s %s %v", dtype, name, cos.DType, cos.Shape)
		}
		if v := values(t, cos)[8]; math.Abs(v-math.Cos(1)) > tol || v == float64(float32(math.Cos(1))) {
			t.Fatalf("%s cos[1,0] = %v, want cos(1) rounded to %s", dtype, v, dtype)
		}
	}
}

func TestAlibiSlopesAndT5Buckets(t *testing.T) {
	c, _ := setup(t)
	b, err := c.Table("/v1/alibi/slopes", params("num_heads", "8"))
	if err != nil {
		t.Fatal(err)
	}
	if s := values(t, b.Tensors["slopes"]); s[0] != 0.5 || s[1] != 0.25 || s[7] != 1.0/256 {
		t.Fatalf("slopes %v", s)
	}
	_, buckets, err := c.RawTensor("/v1/t5/buckets", params("query_length", "4", "key_length", "6"), "")
	if err != nil {
		t.Fatal(err)
	}
	v, err := buckets.Int64s()
	if err != nil {
		t.Fatal(err)
	}
	// bidirectional, 32 buckets: key after query -> 16 + distance, before -> distance.
	if v[0*6+1] != 17 || v[1*6+0] != 1 || v[3*6+5] != 18 || v[0] != 0 {
		t.Fatalf("buckets %v", v)
	}
}

func TestFixtureTablesByteForByte(t *testing.T) {
	c, f := setup(t)
	if len(f.Tables) < 10 {
		t.Fatalf("only %d table cases in the fixtures", len(f.Tables))
	}
	for _, tc := range f.Tables {
		q := url.Values{}
		for k, v := range tc.Params {
			q.Set(k, v)
		}
		label := tc.Endpoint + "?" + q.Encode()
		b, err := c.Table(tc.Endpoint, q)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		if len(b.Tensors) != len(tc.Tensors) {
			t.Fatalf("%s: tensors %v", label, b.Names())
		}
		for name, doc := range tc.Tensors {
			want := doc.tensor(t)
			got := b.Tensors[name]
			if got.DType != want.DType || !reflect.DeepEqual(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) {
				t.Fatalf("safetensors %s %s differs", label, name)
			}
			rawName, raw, err := c.RawTensor(tc.Endpoint, q, name)
			if err != nil {
				t.Fatalf("raw %s %s: %v", label, name, err)
			}
			if rawName != name || raw.DType != want.DType || !reflect.DeepEqual(raw.Shape, want.Shape) ||
				!bytes.Equal(raw.Data, want.Data) {
				t.Fatalf("raw %s %s differs", label, name)
			}
		}
	}
}

func TestErrorEnvelope(t *testing.T) {
	c, _ := setup(t)
	_, err := c.Table("/v1/sinusoidal", params("max_position", "0", "dim", "8"))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *Error, got %v", err)
	}
	if e.Status != 422 || e.Type != "invalid_parameter" || !strings.Contains(e.Message, "max_position") {
		t.Fatalf("error %+v", e)
	}
	_, err = c.Infer("no_such_model", []InferInput{{"x", Tensor{"float32", []int{1}, make([]byte, 4)}}}, "")
	if !errors.As(err, &e) || e.Status != 404 {
		t.Fatalf("unknown model: %v", err)
	}
}

func TestInferMatchesOnnxruntime(t *testing.T) {
	c, f := setup(t)
	if f.Infer == nil {
		t.Fatal("the fixtures hold no inference case (no model in onnx/)")
	}
	var inputs []InferInput
	for name, doc := range f.Infer.Inputs {
		inputs = append(inputs, InferInput{name, doc.tensor(t)})
	}
	result, err := c.Infer(f.Infer.Model, inputs, "go-client-test")
	if err != nil {
		t.Fatal(err)
	}
	if result.ID != "go-client-test" || len(result.Outputs) != len(f.Infer.Outputs) {
		t.Fatalf("id %q, outputs %d", result.ID, len(result.Outputs))
	}
	for name, doc := range f.Infer.Outputs {
		want := doc.tensor(t)
		got, ok := result.Outputs[name]
		if !ok || got.DType != want.DType || !reflect.DeepEqual(got.Shape, want.Shape) {
			t.Fatalf("output %s: %+v", name, got.Shape)
		}
		g, w := values(t, got), values(t, want)
		worst := 0.0
		for i := range w {
			worst = math.Max(worst, math.Abs(g[i]-w[i]))
		}
		// Same runtime and inputs; batching may change the summation order a little, never more.
		if worst > 1e-5 {
			t.Fatalf("%s: max abs difference %g", name, worst)
		}
	}
}

func TestFloat16Decoding(t *testing.T) {
	cases := map[uint16]float64{0x3c00: 1, 0xc000: -2, 0x0001: math.Pow(2, -24), 0x7bff: 65504, 0x7c00: math.Inf(1)}
	for bits, want := range cases {
		if got := Float16ToFloat64(bits); got != want {
			t.Fatalf("%#04x: %v, want %v", bits, got, want)
		}
	}
}

// The client's dtype table against models/dtypes.py (the fixtures' dtypes): a dtype added or renamed
// there fails here.
func TestDTypeTableMatchesModels(t *testing.T) {
	_, f := setup(t)
	if len(f.DTypes) < 13 {
		t.Fatalf("only %d dtypes in the fixtures", len(f.DTypes))
	}
	want := map[string]fixtureDType{}
	for _, d := range f.DTypes {
		want[d.Name] = d
	}
	got := map[string]fixtureDType{}
	for _, d := range dtypes {
		got[d.name] = fixtureDType{Name: d.name, Safetensors: d.safetensors, KServe: d.kserve, Size: d.size}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("dtype table:\n client   %v\n dtypes.py %v", got, want)
	}
}
