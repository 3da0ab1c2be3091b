// Command floor serves one role of package floor (internal/floor) as a
// process of its own: the floor of the whole-path benchmark
// (internal/pathbench, route=floor).
//
//	floor -role state -addr A -data-dir D
//	floor -role operator -addr A -state-addr S -base-url URL -model M -workspace W
//	floor -role operator -trivial -addr A
//	floor -role orchestrator -addr A -data-dir D -state-addr S -operator-addr O
//
// It stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/floor"
	"github.com/secbear/neuron/services/operator/provider/openai"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "floor: %v\n", err)
		os.Exit(2)
	}
}

func run() error {
	role := flag.String("role", "", "state, operator or orchestrator")
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	dataDir := flag.String("data-dir", "", "directory of the bbolt file (state, orchestrator)")
	stateAddr := flag.String("state-addr", "", "the state role's address (operator, orchestrator)")
	operatorAddr := flag.String("operator-addr", "", "the operator role's address (orchestrator)")
	baseURL := flag.String("base-url", "", "the model server's base URL, http://HOST:PORT/v1 (operator)")
	model := flag.String("model", "mock-1", "model name (operator)")
	workspace := flag.String("workspace", ".", "directory the read tool reads from (operator)")
	trivial := flag.Bool("trivial", false, "answer each invocation at once with its message, no model, history or effects (operator)")
	flag.Parse()

	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	switch *role {
	case "state":
		db, err := floor.OpenDB(*dataDir, "state.db")
		if err != nil {
			return err
		}
		defer db.Close()
		statev1.RegisterStateServiceServer(srv, floor.NewState(db))
	case "operator":
		if *trivial {
			operatorv1.RegisterOperatorServiceServer(srv, floor.TrivialOperator())
			break
		}
		st, err := dial(*stateAddr)
		if err != nil {
			return err
		}
		p, err := openai.NewCompatible(openai.Config{BaseURL: *baseURL})
		if err != nil {
			return err
		}
		operatorv1.RegisterOperatorServiceServer(srv, floor.NewOperator(statev1.NewStateServiceClient(st), p, *model, *workspace))
	case "orchestrator":
		db, err := floor.OpenDB(*dataDir, "journal.db")
		if err != nil {
			return err
		}
		defer db.Close()
		st, err := dial(*stateAddr)
		if err != nil {
			return err
		}
		oc, err := dial(*operatorAddr)
		if err != nil {
			return err
		}
		orchestratorv1.RegisterOrchestratorServiceServer(srv, floor.NewOrchestrator(db, statev1.NewStateServiceClient(st), operatorv1.NewOperatorServiceClient(oc)))
	default:
		return fmt.Errorf("-role %q: want state, operator or orchestrator", *role)
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	return srv.Serve(lis)
}

func dial(addr string) (*grpc.ClientConn, error) {
	if addr == "" {
		return nil, errors.New("the address of a service it calls is missing")
	}
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}
