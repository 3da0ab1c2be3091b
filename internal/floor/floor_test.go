package floor

import (
	"context"
	"net"
	"testing"

	"go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/scope"
)

func serve(t *testing.T, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	gs := grpc.NewServer()
	register(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// The floor does the work it stands for: a Dispatch through the trivial
// operator is answered with its output, the transcript entry is in State
// and the journal holds the workflow's record.
func TestDispatchDoesTheWork(t *testing.T) {
	dir := t.TempDir()
	stateDB, err := OpenDB(dir, "state.db")
	if err != nil {
		t.Fatal(err)
	}
	defer stateDB.Close()
	journal, err := OpenDB(dir, "journal.db")
	if err != nil {
		t.Fatal(err)
	}
	defer journal.Close()
	st := serve(t, func(s *grpc.Server) { statev1.RegisterStateServiceServer(s, NewState(stateDB)) })
	op := serve(t, func(s *grpc.Server) { operatorv1.RegisterOperatorServiceServer(s, TrivialOperator()) })
	orch := serve(t, func(s *grpc.Server) {
		orchestratorv1.RegisterOrchestratorServiceServer(s, NewOrchestrator(journal, statev1.NewStateServiceClient(st), operatorv1.NewOperatorServiceClient(op)))
	})
	ctx := context.Background()
	resp, err := orchestratorv1.NewOrchestratorServiceClient(orch).Dispatch(ctx, &orchestratorv1.DispatchRequest{
		AgentId: "a", Input: &operatorv1.OperatorInput{Message: content.Text("ping")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := content.TextOf(resp.GetOutput().GetMessage()); got != "ping" || resp.GetOutput().GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
		t.Fatalf("output %q %v", got, resp.GetOutput().GetExitReason())
	}
	list, err := statev1.NewStateServiceClient(st).List(ctx, &statev1.ListRequest{Scope: scope.Workflow(resp.GetWorkflowId()), IncludeValues: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetItems()) != 1 || list.GetItems()[0].GetValue().GetStructValue().GetFields()["output"].GetStringValue() != "ping" {
		t.Fatalf("transcript in State: %v", list.GetItems())
	}
	err = journal.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucket).Get([]byte(resp.GetWorkflowId())) == nil {
			t.Errorf("no journal record for %s", resp.GetWorkflowId())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
