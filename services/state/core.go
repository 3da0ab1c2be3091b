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
	if g.Unindexed {
		g.Embedding = nil
	} else if g.Embedding != nil {
		if g.Embedding, err = checkVector(g.Embedding, "embedding"); err != nil {
			return nil, err
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
// the key the page starts strictly after (or, reversed, strictly before;
// "" and false for the first page).
func (c *core) listStart(ctx context.Context, s *typesv1.Scope, q ListQuery) (enc []byte, after string, hasAfter bool, err error) {
	enc, err = c.scopeOnly(ctx, s)
	if err != nil {
		return nil, "", false, err
	}
	if err := checkPageSize(q.PageSize); err != nil {
		return nil, "", false, err
	}
	if q.PageToken == "" {
		return enc, "", false, nil
	}
	after, err = c.tokens.open(q.PageToken, enc, q.Prefix, q.Reverse)
	if err != nil {
		return nil, "", false, err
	}
	return enc, after, true, nil
}

// pager collects the items of a page in listing order.
type pager struct {
	q     ListQuery
	items []ListItem
	bytes int  // keys and values so far (q.Values)
	more  bool // an item follows the page
}

// add appends the next item; raw is its stored value (read only when
// q.Values). False: the page is full and the listing stops here (the
// item offered is the next page's).
func (p *pager) add(key string, rev uint64, raw []byte) (bool, error) {
	if len(p.items) == p.q.PageSize {
		p.more = true
		return false, nil
	}
	it := ListItem{Key: key, Revision: rev}
	if p.q.Values {
		n := len(key) + len(raw)
		if len(p.items) > 0 && p.bytes+n > MaxPageValueBytes {
			p.more = true
			return false, nil
		}
		p.bytes += n
		v, err := unmarshalValue(raw)
		if err != nil {
			return false, err
		}
		it.Value = v
	}
	p.items = append(p.items, it)
	return true, nil
}

// finishPage returns the page p collected, with the token of the next
// when an item follows.
func (c *core) finishPage(enc []byte, p *pager) ListPage {
	if !p.more {
		return ListPage{Items: p.items}
	}
	last := p.items[len(p.items)-1].Key
	return ListPage{Items: p.items, NextPageToken: c.tokens.issue(enc, p.q.Prefix, last, p.q.Reverse)}
}

// prefixEnd returns the smallest byte string greater than every string
// with prefix, or nil when there is none (an empty or all-0xff prefix).
func prefixEnd(prefix []byte) []byte {
	for i := len(prefix) - 1; i >= 0; i-- {
		if prefix[i] < 0xff {
			end := bytes.Clone(prefix[:i+1])
			end[i]++
			return end
		}
	}
	return nil
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
