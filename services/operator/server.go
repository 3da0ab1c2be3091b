package operator

import (
	"context"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
)

// Server serves OperatorService over gRPC. Input validation
// (protovalidate) and error mapping are done by the standard interceptor
// chain (pkg/grpcserver); handlers return errors wrapping errs kinds.
type Server struct {
	operatorv1.UnimplementedOperatorServiceServer
	op *Operator
}

// NewServer returns a server running invocations on op.
func NewServer(op *Operator) *Server { return &Server{op: op} }

// Execute implements OperatorService.Execute.
func (s *Server) Execute(ctx context.Context, req *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	out, err := s.op.Execute(ctx, req.GetInput(), nil)
	if err != nil {
		return nil, err
	}
	return &operatorv1.ExecuteResponse{Output: out}, nil
}

// ExecuteStream implements OperatorService.ExecuteStream: progress events,
// then the same output Execute returns.
func (s *Server) ExecuteStream(req *operatorv1.ExecuteStreamRequest, stream operatorv1.OperatorService_ExecuteStreamServer) error {
	out, err := s.op.Execute(stream.Context(), req.GetInput(), stream.Send)
	if err != nil {
		return err
	}
	return stream.Send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{Output: out}})
}
