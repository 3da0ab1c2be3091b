package errs

import (
	"testing"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// Every reason a kind sends is in the contract's ErrorReason enum, and
// every value of the enum is the reason of exactly one kind: a reason
// added on one side only fails here.
func TestReasonsAreTheContractEnum(t *testing.T) {
	byReason := map[string][]string{}
	for _, k := range Kinds() {
		if k.Reason() == "" {
			continue
		}
		byReason[k.Reason()] = append(byReason[k.Reason()], k.Error())
		if r := ReasonOf(k.Reason()); r == typesv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
			t.Errorf("kind %q sends reason %q, which layer0.types.v1.ErrorReason does not define", k, k.Reason())
		}
	}
	for v, name := range typesv1.ErrorReason_name {
		r := typesv1.ErrorReason(v)
		if r == typesv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
			continue
		}
		if got := byReason[ReasonName(r)]; len(got) != 1 {
			t.Errorf("ErrorReason %s (wire %q) is the reason of kinds %v; want exactly one", name, ReasonName(r), got)
		}
		if ReasonOf(ReasonName(r)) != r {
			t.Errorf("ReasonOf(ReasonName(%s)) = %v", name, ReasonOf(ReasonName(r)))
		}
	}
	if ReasonName(typesv1.ErrorReason_ERROR_REASON_UNSPECIFIED) != "" || ReasonOf("NO_SUCH_REASON") != typesv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		t.Error("UNSPECIFIED must map to and from the empty reason only")
	}
}
