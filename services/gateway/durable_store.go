package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// StateScope is the State service scope (a custom scope) that holds the
// gateway's durable records: lanes ("lane/<session>"), schedules
// ("schedule/<name>") and push-notification configs
// ("push/<task>/<config>").
const StateScope = "neuron-gateway"

// kv reads and writes JSON records in the gateway's State scope, with
// compare-and-set on the key's revision.
type kv struct {
	st statev1.StateServiceClient
	sc *typesv1.Scope
}

func newKV(st statev1.StateServiceClient) *kv { return &kv{st: st, sc: scope.Custom(StateScope)} }

// get reads key into v; its revision, 0 when the key does not exist (v
// is then left alone).
func (s *kv) get(ctx context.Context, key string, v any) (uint64, error) {
	resp, err := s.st.Read(ctx, &statev1.ReadRequest{Scope: s.sc, Key: key})
	if err != nil {
		if err := errs.FromGRPC(err); errors.Is(err, errs.NotFound) {
			return 0, nil
		}
		return 0, fmt.Errorf("reading %s from the State service: %w", key, errs.FromGRPC(err))
	}
	if err := decodeValue(resp.GetValue(), v); err != nil {
		return 0, fmt.Errorf("reading %s from the State service: %w", key, err)
	}
	return resp.GetRevision(), nil
}

// put writes v to key if its revision is still rev (0: it must not
// exist); false when another writer moved it first.
func (s *kv) put(ctx context.Context, key string, v any, rev uint64) (bool, error) {
	val, err := encodeValue(v)
	if err != nil {
		return false, err
	}
	_, err = s.st.Write(ctx, &statev1.WriteRequest{Scope: s.sc, Key: key, Value: val, ExpectedRevision: &rev, Unindexed: true})
	switch err := errs.FromGRPC(err); {
	case err == nil:
		return true, nil
	case errors.Is(err, errs.StaleRevision):
		return false, nil
	default:
		return false, fmt.Errorf("writing %s to the State service: %w", key, err)
	}
}

// del deletes key if its revision is still rev; false when it moved.
func (s *kv) del(ctx context.Context, key string, rev uint64) (bool, error) {
	_, err := s.st.Delete(ctx, &statev1.DeleteRequest{Scope: s.sc, Key: key, ExpectedRevision: &rev})
	switch err := errs.FromGRPC(err); {
	case err == nil:
		return true, nil
	case errors.Is(err, errs.StaleRevision):
		return false, nil
	default:
		return false, fmt.Errorf("deleting %s from the State service: %w", key, err)
	}
}

// delAny deletes key whatever its revision; whether it existed.
func (s *kv) delAny(ctx context.Context, key string) (bool, error) {
	resp, err := s.st.Delete(ctx, &statev1.DeleteRequest{Scope: s.sc, Key: key})
	if err != nil {
		return false, fmt.Errorf("deleting %s from the State service: %w", key, errs.FromGRPC(err))
	}
	return resp.GetExisted(), nil
}

// kvItem is one listed record.
type kvItem struct {
	key      string
	revision uint64
	value    *structpb.Value
}

// list returns every record whose key starts with prefix, in key order.
func (s *kv) list(ctx context.Context, prefix string) ([]kvItem, error) {
	var out []kvItem
	token := ""
	for {
		resp, err := s.st.List(ctx, &statev1.ListRequest{Scope: s.sc, Prefix: prefix, PageSize: 1000, PageToken: token, IncludeValues: true})
		if err != nil {
			return nil, fmt.Errorf("listing %s* in the State service: %w", prefix, errs.FromGRPC(err))
		}
		for _, it := range resp.GetItems() {
			v := it.GetValue()
			if v == nil { // a server that returns no values: read the key
				r, err := s.st.Read(ctx, &statev1.ReadRequest{Scope: s.sc, Key: it.GetKey()})
				if errors.Is(errs.FromGRPC(err), errs.NotFound) {
					continue
				}
				if err != nil {
					return nil, fmt.Errorf("reading %s from the State service: %w", it.GetKey(), errs.FromGRPC(err))
				}
				v = r.GetValue()
			}
			out = append(out, kvItem{key: it.GetKey(), revision: it.GetRevision(), value: v})
		}
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

func encodeValue(v any) (*structpb.Value, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	val := &structpb.Value{}
	if err := protojson.Unmarshal(b, val); err != nil {
		return nil, err
	}
	return val, nil
}

func decodeValue(val *structpb.Value, v any) error {
	b, err := protojson.Marshal(val)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
