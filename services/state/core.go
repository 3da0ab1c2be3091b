package state

import (
	"bytes"
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// core is the request validation and encoding both backends share, so
// that they accept and reject exactly the same inputs.
type core struct {
	opts   options
	tokens tokenSigner
}

// marshalValue encodes a value for storage. Not Deterministic: nothing
// compares stored bytes (a read decodes them, idempotency compares keys),
// and sorting every Struct's keys doubled the cost of encoding a
// conversation entry, a twentieth of a State Write's CPU.
var marshalValue = proto.MarshalOptions{}

func unmarshalValue(raw []byte) (*structpb.Value, error) {
	v := new(structpb.Value)
	if err := proto.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("decode stored value: %w", err)
	}
	return v, nil
}

// target validates the scope and key of a request and returns the
// encoded scope.
func (c *core) target(ctx context.Context, s *typesv1.Scope, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	enc, err := scope.Encode(s)
	if err != nil {
		return nil, err
	}
	if err := c.opts.limits.checkKey(key); err != nil {
		return nil, err
	}
	return enc, nil
}

func (c *core) scopeOnly(ctx context.Context, s *typesv1.Scope) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return scope.Encode(s)
}

func (c *core) prepareWrite(ctx context.Context, s *typesv1.Scope, key string, v *structpb.Value, g Guard) (*mutation, error) {
	enc, err := c.target(ctx, s, key)
	if err != nil {
		return nil, err
	}
	if err := checkIdempotencyKey(g.IdempotencyKey); err != nil {
		return nil, err
	}
	if err := c.opts.limits.checkValue(v); err != nil {
		return nil, err
	}
	// The bytes the server's codec decoded v from, when it did (codec.go);
	// otherwise v encoded.
	raw, ok := received.take(v)
	if !ok {
		var err error
		if raw, err = marshalValue.Marshal(v); err != nil {
			return nil, fmt.Errorf("value cannot be encoded: %v: %w", err, errs.InvalidArgument)
		}
	}
	return &mutation{op: opWrite, scopeEnc: enc, scope: s, key: key, raw: raw, guard: g, now: c.opts.now()}, nil
}

func (c *core) prepareDelete(ctx context.Context, s *typesv1.Scope, key string, g Guard) (*mutation, error) {
	enc, err := c.target(ctx, s, key)
	if err != nil {
		return nil, err
	}
	if err := checkIdempotencyKey(g.IdempotencyKey); err != nil {
		return nil, err
	}
	return &mutation{op: opDelete, scopeEnc: enc, scope: s, key: key, guard: g, now: c.opts.now()}, nil
}

// listStart validates a List request and returns the encoded scope and
// the key the page starts strictly after ("" and false for the first
// page).
func (c *core) listStart(ctx context.Context, s *typesv1.Scope, prefix, token string, pageSize int) (enc []byte, after string, hasAfter bool, err error) {
	enc, err = c.scopeOnly(ctx, s)
	if err != nil {
		return nil, "", false, err
	}
	if err := checkPageSize(pageSize); err != nil {
		return nil, "", false, err
	}
	if token == "" {
		return enc, "", false, nil
	}
	after, err = c.tokens.open(token, enc, prefix)
	if err != nil {
		return nil, "", false, err
	}
	return enc, after, true, nil
}

// finishPage trims items fetched with one extra look-ahead item to
// pageSize and issues the next token.
func (c *core) finishPage(enc []byte, prefix string, items []ListItem, pageSize int) ListPage {
	if len(items) <= pageSize {
		return ListPage{Items: items}
	}
	items = items[:pageSize]
	return ListPage{Items: items, NextPageToken: c.tokens.issue(enc, prefix, items[len(items)-1].Key)}
}

func notFound(s *typesv1.Scope, key string) error {
	return fmt.Errorf("key %q in %s: %w", truncate(key), scope.String(s), errs.NotFound)
}

var errClosed = fmt.Errorf("state store is closed: %w", errs.Unavailable)

// splitKey splits a stored key into the encoded scope and the key.
func splitKey(ck []byte) (enc []byte, key string, err error) {
	_, rest, err := scope.Split(ck)
	if err != nil {
		return nil, "", fmt.Errorf("stored key: %w", err)
	}
	n := len(ck) - len(rest)
	return bytes.Clone(ck[:n]), string(rest), nil
}
