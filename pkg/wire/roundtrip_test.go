package wire_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	// Registers every layer0 file and message type.
	_ "github.com/secbear/neuron/gen/layer0/environment/v1"
	_ "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	_ "github.com/secbear/neuron/gen/layer0/middleware/v1"
	_ "github.com/secbear/neuron/gen/layer0/operator/v1"
	_ "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	_ "github.com/secbear/neuron/gen/layer0/state/v1"
	_ "github.com/secbear/neuron/gen/layer0/types/v1"
)

// minMessages is the number of message types each layer0 package declared
// when this test was written. A package falling below it means a message
// (or a whole package's registration) went missing; raise the numbers when
// messages are added.
var minMessages = map[protoreflect.FullName]int{
	"layer0.types.v1":        24,
	"layer0.operator.v1":     25,
	"layer0.orchestrator.v1": 19,
	"layer0.state.v1":        12,
	"layer0.environment.v1":  19,
	"layer0.middleware.v1":   10,
	"layer0.lifecycle.v1":    15,
}

// customVariants are the extension points of the open sets. They are
// covered by the generic checks below; naming them here makes the test
// fail loudly if one is renamed or dropped.
var customVariants = []protoreflect.FullName{
	"layer0.types.v1.ContentBlock.custom",
	"layer0.types.v1.Effect.custom",
	"layer0.types.v1.Scope.custom",
	"layer0.environment.v1.IsolationBoundary.custom",
	"layer0.operator.v1.EXIT_KIND_CUSTOM",
	"layer0.operator.v1.TRIGGER_TYPE_CUSTOM",
}

// layer0Messages returns every message declared in a layer0 file, nested
// ones included and map entries excluded, sorted by full name.
func layer0Messages() []protoreflect.MessageDescriptor {
	var out []protoreflect.MessageDescriptor
	var walk func(protoreflect.MessageDescriptors)
	walk = func(mds protoreflect.MessageDescriptors) {
		for i := range mds.Len() {
			md := mds.Get(i)
			if md.IsMapEntry() {
				continue
			}
			out = append(out, md)
			walk(md.Messages())
		}
	}
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if strings.HasPrefix(string(fd.Package()), "layer0.") {
			walk(fd.Messages())
		}
		return true
	})
	slices.SortFunc(out, func(a, b protoreflect.MessageDescriptor) int {
		return strings.Compare(string(a.FullName()), string(b.FullName()))
	})
	return out
}

func TestEveryMessageRoundTrips(t *testing.T) {
	mds := layer0Messages()
	cov := newCoverage(mds)
	perPackage := map[protoreflect.FullName]int{}
	var visited []string

	for _, md := range mds {
		t.Run(string(md.FullName()), func(t *testing.T) {
			mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
			if err != nil {
				t.Fatalf("declared in %s but no Go type is registered: %v", md.ParentFile().Path(), err)
			}
			vs, err := variants(mt)
			if err != nil {
				t.Fatalf("fill: %v", err)
			}
			if missing := populated(vs[0].msg.ProtoReflect(), 0); len(missing) > 0 {
				t.Errorf("filler left fields unset: %s", strings.Join(missing, ", "))
			}
			for _, v := range vs {
				for _, got := range roundTrip(t, v) {
					cov.record(got.ProtoReflect())
				}
			}
			perPackage[md.ParentFile().Package()]++
			visited = append(visited, fmt.Sprintf("%s (%d variants)", md.FullName(), len(vs)))
		})
	}

	for pkg, want := range minMessages {
		if got := perPackage[pkg]; got < want {
			t.Errorf("package %s: %d message types round-tripped, want at least %d", pkg, got, want)
		}
	}
	total := 0
	for _, n := range minMessages {
		total += n
	}
	if len(visited) < total {
		t.Errorf("%d message types round-tripped, want at least %d; visited:\n  %s",
			len(visited), total, strings.Join(visited, "\n  "))
	}
	if missing := cov.missing(); len(missing) > 0 {
		t.Errorf("never round-tripped (oneof members and enum values):\n  %s", strings.Join(missing, "\n  "))
	}
	for _, name := range customVariants {
		if !cov.want[name] {
			t.Errorf("custom variant %s no longer exists in the protos", name)
		}
	}
	t.Logf("round-tripped %d message types, %d oneof members and enum values", len(visited), len(cov.want))
}

// roundTrip checks that v survives proto binary and protojson, and
// returns the two decoded copies.
func roundTrip(t *testing.T, v variant) []proto.Message {
	t.Helper()
	newMsg := func() proto.Message { return v.msg.ProtoReflect().Type().New().Interface() }

	b, err := proto.Marshal(v.msg)
	if err != nil {
		t.Fatalf("%s: proto.Marshal: %v", v.name, err)
	}
	fromBinary := newMsg()
	if err := proto.Unmarshal(b, fromBinary); err != nil {
		t.Fatalf("%s: proto.Unmarshal: %v", v.name, err)
	}
	if !proto.Equal(v.msg, fromBinary) {
		t.Errorf("%s: binary round trip changed the message:\n sent %v\n got  %v", v.name, v.msg, fromBinary)
	}

	j, err := protojson.Marshal(v.msg)
	if err != nil {
		t.Fatalf("%s: protojson.Marshal: %v", v.name, err)
	}
	fromJSON := newMsg()
	if err := protojson.Unmarshal(j, fromJSON); err != nil {
		t.Fatalf("%s: protojson.Unmarshal of %s: %v", v.name, j, err)
	}
	if !proto.Equal(v.msg, fromJSON) {
		t.Errorf("%s: JSON round trip changed the message:\n sent %v\n json %s\n got  %v", v.name, v.msg, j, fromJSON)
	}
	return []proto.Message{fromBinary, fromJSON}
}

// coverage tracks which oneof members and non-zero enum values of layer0
// fields have been seen in decoded messages.
type coverage struct {
	want map[protoreflect.FullName]bool // everything there is to see
	seen map[protoreflect.FullName]bool
}

func newCoverage(mds []protoreflect.MessageDescriptor) *coverage {
	c := &coverage{want: map[protoreflect.FullName]bool{}, seen: map[protoreflect.FullName]bool{}}
	for _, md := range mds {
		for i := range md.Fields().Len() {
			fd := md.Fields().Get(i)
			if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
				c.want[fd.FullName()] = true
			}
			if fd.IsMap() {
				fd = fd.MapValue()
			}
			if ed := fd.Enum(); ed != nil {
				for _, n := range nonZeroValues(ed) {
					c.want[ed.Values().ByNumber(n).FullName()] = true
				}
			}
		}
	}
	return c
}

// record walks m and marks what it holds as seen.
func (c *coverage) record(m protoreflect.Message) {
	if !strings.HasPrefix(string(m.Descriptor().FullName()), "layer0.") {
		return // well-known types are not ours to cover.
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
			c.seen[fd.FullName()] = true
		}
		each := func(v protoreflect.Value) {
			switch {
			case fd.Enum() != nil:
				if evd := fd.Enum().Values().ByNumber(v.Enum()); evd != nil {
					c.seen[evd.FullName()] = true
				}
			case fd.Message() != nil:
				c.record(v.Message())
			}
		}
		switch {
		case fd.IsList():
			for i := range v.List().Len() {
				each(v.List().Get(i))
			}
		case fd.IsMap():
			vd := fd.MapValue()
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				if vd.Message() != nil {
					c.record(mv.Message())
				} else if ed := vd.Enum(); ed != nil {
					if evd := ed.Values().ByNumber(mv.Enum()); evd != nil {
						c.seen[evd.FullName()] = true
					}
				}
				return true
			})
		default:
			each(v)
		}
		return true
	})
}

// missing lists what was never seen, sorted.
func (c *coverage) missing() []string {
	var out []string
	for name := range c.want {
		if !c.seen[name] {
			out = append(out, string(name))
		}
	}
	slices.Sort(out)
	return out
}
