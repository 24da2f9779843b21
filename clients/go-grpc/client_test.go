package posencgrpc

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "posencgrpc/inference"
)

// The fixtures scripts/client_fixtures.py writes (the HTTP clients' own): the dtype table and the inference case.
type fixtureTensor struct {
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
	B64   string `json:"b64"`
}

type fixtures struct {
	DTypes []struct {
		Name   string `json:"name"`
		KServe string `json:"kserve"`
	} `json:"dtypes"`
	Infer *struct {
		Model   string                   `json:"model"`
		Inputs  map[string]fixtureTensor `json:"inputs"`
		Outputs map[string]fixtureTensor `json:"outputs"`
	} `json:"infer"`
}

func setup(t *testing.T) (*Client, *fixtures, context.Context) {
	address, path := os.Getenv("POSENC_GRPC_ADDRESS"), os.Getenv("POSENC_FIXTURES")
	if address == "" || path == "" {
		t.Fatal("POSENC_GRPC_ADDRESS and POSENC_FIXTURES must be set (scripts/grpc-client-test.sh sets them)")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f fixtures
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if f.Infer == nil {
		t.Fatal("the fixtures hold no inference case (no model in onnx/)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	c, err := Dial(ctx, address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, &f, ctx
}

func (f *fixtures) tensor(t *testing.T, doc fixtureTensor) Tensor {
	data, err := base64.StdEncoding.DecodeString(doc.B64)
	if err != nil {
		t.Fatal(err)
	}
	shape := make([]int64, len(doc.Shape))
	for i, d := range doc.Shape {
		shape[i] = int64(d)
	}
	for _, row := range f.DTypes {
		if row.Name == doc.DType {
			return Tensor{row.KServe, shape, data}
		}
	}
	t.Fatalf("dtype %q is not in the fixtures' table", doc.DType)
	return Tensor{}
}

func (f *fixtures) request(t *testing.T, model, id string) *pb.ModelInferRequest {
	inputs := map[string]Tensor{}
	var names []string
	for name, doc := range f.Infer.Inputs {
		inputs[name] = f.tensor(t, doc)
		names = append(names, name)
	}
	sort.Strings(names)
	return Request(model, id, names, inputs)
}

func float32s(data []byte) []float64 {
	out := make([]float64, len(data)/4)
	for i := range out {
		out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:])))
	}
	return out
}

func (f *fixtures) check(t *testing.T, outputs map[string]Tensor) {
	if len(outputs) != len(f.Infer.Outputs) {
		t.Fatalf("%d outputs, want %d", len(outputs), len(f.Infer.Outputs))
	}
	for name, doc := range f.Infer.Outputs {
		want, got := f.tensor(t, doc), outputs[name]
		if got.Datatype != want.Datatype || !reflect.DeepEqual(got.Shape, want.Shape) {
			t.Fatalf("output %s: %s %v, want %s %v", name, got.Datatype, got.Shape, want.Datatype, want.Shape)
		}
		g, w := float32s(got.Data), float32s(want.Data)
		worst := 0.0
		for i := range w {
			worst = math.Max(worst, math.Abs(g[i]-w[i]))
		}
		// Same runtime and inputs; batching may change the summation order a little, never more.
		if len(g) != len(w) || worst > 1e-5 {
			t.Fatalf("%s: %d values, max abs difference %g", name, len(g), worst)
		}
	}
}

func TestHealthAndMetadata(t *testing.T) {
	c, f, ctx := setup(t)
	live, err := c.API().ServerLive(ctx, &pb.ServerLiveRequest{})
	if err != nil || !live.Live {
		t.Fatalf("live: %v %v", live, err)
	}
	ready, err := c.API().ModelReady(ctx, &pb.ModelReadyRequest{Name: f.Infer.Model})
	if err != nil || !ready.Ready {
		t.Fatalf("model ready: %v %v", ready, err)
	}
	server, err := c.API().ServerMetadata(ctx, &pb.ServerMetadataRequest{})
	if err != nil || server.Name != "posenc" {
		t.Fatalf("server metadata: %v %v", server, err)
	}
	model, err := c.API().ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: f.Infer.Model})
	if err != nil || len(model.Inputs) != len(f.Infer.Inputs) || model.Platform != "onnxruntime_onnx" {
		t.Fatalf("model metadata: %v %v", model, err)
	}
	health, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: f.Infer.Model})
	if err != nil || health.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", health, err)
	}
}

func TestInferMatchesOnnxruntime(t *testing.T) {
	c, f, ctx := setup(t)
	outputs, id, err := c.Infer(ctx, f.request(t, f.Infer.Model, "go-grpc-client-test"))
	if err != nil {
		t.Fatal(err)
	}
	if id != "go-grpc-client-test" {
		t.Fatalf("id %q", id)
	}
	f.check(t, outputs)
}

func TestErrorsAreStatusCodes(t *testing.T) {
	c, f, ctx := setup(t)
	_, _, err := c.Infer(ctx, f.request(t, "no_such_model", ""))
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "unknown model 'no_such_model'") {
		t.Fatalf("unknown model: %v", err)
	}
	bad := f.request(t, f.Infer.Model, "")
	bad.RawInputContents[0] = bad.RawInputContents[0][:len(bad.RawInputContents[0])-4]
	_, _, err = c.Infer(ctx, bad)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "raw_input_contents[0]") {
		t.Fatalf("short input: %v", err)
	}
}

func TestStreamAnswersInOrder(t *testing.T) {
	c, f, ctx := setup(t)
	stream, err := c.API().ModelStreamInfer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	models := []string{f.Infer.Model, "no_such_model", f.Infer.Model}
	for i, model := range models {
		if err := stream.Send(f.request(t, model, string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for i, model := range models {
		response, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if response.InferResponse.GetId() != string(rune('a'+i)) {
			t.Fatalf("response %d has id %q", i, response.InferResponse.GetId())
		}
		if model == "no_such_model" {
			if !strings.Contains(response.ErrorMessage, "unknown model") {
				t.Fatalf("error %q", response.ErrorMessage)
			}
			continue
		}
		outputs, err := Outputs(response.InferResponse)
		if err != nil || response.ErrorMessage != "" {
			t.Fatalf("%v %q", err, response.ErrorMessage)
		}
		f.check(t, outputs)
	}
	if _, err := stream.Recv(); err == nil || err.Error() != "EOF" {
		t.Fatalf("after the last response: %v", err)
	}
}
