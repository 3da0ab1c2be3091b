package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/secbear/neuron/pkg/grpcclient"
)

// Default service addresses, as the services and `neuron up` use them.
const (
	defaultOrchestratorAddr = "127.0.0.1:7070"
	defaultOperatorAddr     = "127.0.0.1:7071"
	defaultStateAddr        = "127.0.0.1:7072"
	defaultEnvironmentAddr  = "127.0.0.1:7073"
)

// conn is the connection flags every client command shares, for one
// service.
type conn struct {
	service   string // "orchestrator" or "state", for messages
	addr      string
	caFile    string
	useTLS    bool
	tokenFile string
	timeout   time.Duration
	json      bool
	hints     map[codes.Code]string
}

// bind registers --addr (default from the env variable, else def),
// the TLS and token flags, --timeout and --json.
func (c *conn) bind(fs *flag.FlagSet, cl *cli, service, env, def string, timeout time.Duration) {
	c.service = service
	fs.StringVar(&c.addr, "addr", cl.envOr(env, def), "address of the "+service+" (env "+env+")")
	fs.BoolVar(&c.useTLS, "tls", false, "connect with TLS, verified against the system roots (default: plaintext, as `neuron up` serves in dev mode)")
	fs.StringVar(&c.caFile, "ca", "", "connect with TLS, verified against this CA bundle")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding a bearer token to send")
	fs.DurationVar(&c.timeout, "timeout", timeout, "give up after this long")
	fs.BoolVar(&c.json, "json", false, "print one protojson object per line, for scripts")
}

// dial connects (lazily: the first call reports an unreachable service).
func (c *conn) dial() (*grpc.ClientConn, error) {
	cfg := grpcclient.Config{
		Target:    c.addr,
		Dev:       !c.useTLS && c.caFile == "",
		CAFile:    c.caFile,
		TokenFile: c.tokenFile,
		Timeout:   c.timeout,
	}
	cc, err := grpcclient.Dial(cfg)
	if err != nil {
		return nil, fmt.Errorf("--addr %s: %w", c.addr, err)
	}
	return cc, nil
}

// wrap marks err as a failed call to this service, for the error line.
func (c *conn) wrap(err error) error {
	if err == nil {
		return nil
	}
	return &rpcError{service: c.service, addr: c.addr, hints: c.hints, err: err}
}

// protoLine is m as compact protojson on one line.
func protoLine(m proto.Message) []byte {
	b, err := protojson.Marshal(m)
	if err != nil {
		return []byte(`{}`)
	}
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return b
	}
	return buf.Bytes()
}

// printJSONLine writes v (a proto message or any JSON-marshalable value)
// as one line of JSON.
func printJSONLine(w io.Writer, v any) {
	var b []byte
	if m, ok := v.(proto.Message); ok {
		b = protoLine(m)
	} else {
		var err error
		if b, err = json.Marshal(v); err != nil {
			b = []byte(`{}`)
		}
	}
	_, _ = w.Write(append(b, '\n'))
}

// rawProto embeds m's protojson in a JSON value built with encoding/json.
func rawProto(m proto.Message) json.RawMessage { return json.RawMessage(protoLine(m)) }
