package posencgrpc

import (
	"sort"
	"testing"

	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// What `grpcurl list` and `grpcurl describe inference.GRPCInferenceService` ask, with grpc-go's own reflection
// client: the services by name, then the file that defines the service, with every file it imports, built into
// descriptors without any .proto file at hand.
func TestReflectionListsAndDescribesTheServices(t *testing.T) {
	c, _, ctx := setup(t)
	stream, err := rpb.NewServerReflectionClient(c.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(request *rpb.ServerReflectionRequest) *rpb.ServerReflectionResponse {
		if err := stream.Send(request); err != nil {
			t.Fatal(err)
		}
		answer, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if failure := answer.GetErrorResponse(); failure != nil {
			t.Fatalf("reflection error %d: %s", failure.ErrorCode, failure.ErrorMessage)
		}
		return answer
	}
	var names []string
	for _, service := range ask(&rpb.ServerReflectionRequest{
		MessageRequest: &rpb.ServerReflectionRequest_ListServices{ListServices: ""}}).GetListServicesResponse().Service {
		names = append(names, service.Name)
	}
	sort.Strings(names)
	for _, want := range []string{"grpc.health.v1.Health", "inference.GRPCInferenceService"} {
		if i := sort.SearchStrings(names, want); i == len(names) || names[i] != want {
			t.Fatalf("reflection lists %v, not %s", names, want)
		}
	}
	files := map[string]*descriptorpb.FileDescriptorProto{}
	pending := []*rpb.ServerReflectionRequest{{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "inference.GRPCInferenceService"}}}
	for len(pending) > 0 {
		request := pending[0]
		pending = pending[1:]
		for _, raw := range ask(request).GetFileDescriptorResponse().FileDescriptorProto {
			file := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(raw, file); err != nil {
				t.Fatal(err)
			}
			if _, seen := files[file.GetName()]; seen {
				continue
			}
			files[file.GetName()] = file
			for _, dependency := range file.Dependency {
				if _, seen := files[dependency]; !seen {
					pending = append(pending, &rpb.ServerReflectionRequest{
						MessageRequest: &rpb.ServerReflectionRequest_FileByFilename{FileByFilename: dependency}})
				}
			}
		}
	}
	set := &descriptorpb.FileDescriptorSet{}
	for _, file := range files {
		set.File = append(set.File, file)
	}
	registry, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatalf("the reflected files do not build: %v", err)
	}
	found, err := registry.FindDescriptorByName("inference.GRPCInferenceService")
	if err != nil {
		t.Fatal(err)
	}
	service, ok := found.(protoreflect.ServiceDescriptor)
	if !ok {
		t.Fatalf("inference.GRPCInferenceService is a %T", found)
	}
	for _, want := range []string{"ModelInfer", "ModelStreamInfer", "ModelMetadata", "SystemSharedMemoryRegister"} {
		if service.Methods().ByName(protoreflect.Name(want)) == nil {
			t.Fatalf("inference.GRPCInferenceService has no %s", want)
		}
	}
}
