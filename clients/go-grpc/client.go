// Package posencgrpc is a small Go client of posenc's KServe v2 / Triton gRPC service
// (inference.GRPCInferenceService), on stubs generated at build time from the protocol's descriptors
// (Triton's grpc_service.proto and model_config.proto, as tritonclient ships them: scripts/grpc-client-test.sh).
package posencgrpc

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	pb "posencgrpc/inference"
)

// Tensor is one tensor's little-endian, C-order bytes with its KServe datatype and shape.
type Tensor struct {
	Datatype string
	Shape    []int64
	Data     []byte
}

// Client calls one server.
type Client struct {
	conn *grpc.ClientConn
	api  pb.GRPCInferenceServiceClient
}

// Dial connects (without TLS) to host:port.
func Dial(ctx context.Context, address string) (*Client, error) {
	conn, err := grpc.DialContext(ctx, address, grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30), grpc.MaxCallSendMsgSize(1<<30)))
	if err != nil {
		return nil, err
	}
	return &Client{conn, pb.NewGRPCInferenceServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// API is the generated client, for the methods this package does not wrap.
func (c *Client) API() pb.GRPCInferenceServiceClient { return c.api }

// Request builds a ModelInferRequest whose inputs travel in raw_input_contents, in the order of names.
func Request(model, id string, names []string, inputs map[string]Tensor) *pb.ModelInferRequest {
	request := &pb.ModelInferRequest{ModelName: model, Id: id}
	for _, name := range names {
		tensor := inputs[name]
		request.Inputs = append(request.Inputs, &pb.ModelInferRequest_InferInputTensor{
			Name: name, Datatype: tensor.Datatype, Shape: tensor.Shape})
		request.RawInputContents = append(request.RawInputContents, tensor.Data)
	}
	return request
}

// Outputs are a response's tensors by name (their bytes from raw_output_contents).
func Outputs(response *pb.ModelInferResponse) (map[string]Tensor, error) {
	if len(response.RawOutputContents) != len(response.Outputs) {
		return nil, fmt.Errorf("%d outputs, %d raw_output_contents", len(response.Outputs),
			len(response.RawOutputContents))
	}
	out := map[string]Tensor{}
	for i, tensor := range response.Outputs {
		out[tensor.Name] = Tensor{tensor.Datatype, tensor.Shape, response.RawOutputContents[i]}
	}
	return out, nil
}

// Infer runs one request.
func (c *Client) Infer(ctx context.Context, request *pb.ModelInferRequest) (map[string]Tensor, string, error) {
	response, err := c.api.ModelInfer(ctx, request)
	if err != nil {
		return nil, "", err
	}
	outputs, err := Outputs(response)
	return outputs, response.Id, err
}
