package money

import (
	"fmt"
	"strings"

	"github.com/shopspring/decimal"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// MaxLen is the longest amount string Parse accepts. No real amount of
// dollars needs more; the limit bounds the work a hostile input can cause.
const MaxLen = 64

// FromDecimal returns d as Money in canonical form: no exponent, no
// trailing zeros in the fraction, no point for whole amounts, "0" for zero.
// The form does not depend on decimal's package-level formatting options.
//
// FromDecimal panics if d is negative or if its canonical form is longer
// than MaxLen (round it first with d.Round): both are programming errors,
// since Money is never negative and Parse would reject the result.
func FromDecimal(d decimal.Decimal) *typesv1.Money {
	s, err := format(d)
	if err != nil {
		panic("money.FromDecimal: " + err.Error())
	}
	return &typesv1.Money{Amount: s}
}

// format is the canonical string of a non-negative d.
func format(d decimal.Decimal) (string, error) {
	if d.IsNegative() {
		return "", fmt.Errorf("amount %s is negative: %w", d.String(), errs.InvalidArgument)
	}
	var s string
	if exp := d.Exponent(); exp >= 0 {
		s = d.StringFixed(0)
	} else {
		// Rounding to the number's own exponent is exact; StringFixed
		// never uses scientific notation and never trims, so we trim.
		s = d.StringFixed(-exp)
		s = strings.TrimRight(s, "0")
		s = strings.TrimSuffix(s, ".")
	}
	if len(s) > MaxLen {
		return "", fmt.Errorf("amount %s...: %d characters, at most %d: %w", s[:16], len(s), MaxLen, errs.InvalidArgument)
	}
	return s, nil
}

// Parse returns the amount of m. nil and the empty string are zero. An
// amount that is not digits with an optional point followed by digits, or
// is longer than MaxLen, is an error wrapping errs.InvalidArgument that
// quotes the bad value.
func Parse(m *typesv1.Money) (decimal.Decimal, error) {
	s := m.GetAmount()
	if s == "" {
		return decimal.Zero, nil
	}
	if len(s) > MaxLen {
		return decimal.Decimal{}, fmt.Errorf("money amount %q...: %d characters, at most %d: %w", s[:16], len(s), MaxLen, errs.InvalidArgument)
	}
	if !wellFormed(s) {
		return decimal.Decimal{}, fmt.Errorf("money amount %q: want digits with an optional fraction, such as \"0.0125\", no sign or exponent: %w", s, errs.InvalidArgument)
	}
	d, err := decimal.NewFromString(s)
	if err != nil {
		// Unreachable for a well-formed string; kept so a decimal library
		// change cannot turn into a silent zero.
		return decimal.Decimal{}, fmt.Errorf("money amount %q: %v: %w", s, err, errs.InvalidArgument)
	}
	return d, nil
}

// wellFormed reports whether s matches ^[0-9]+(\.[0-9]+)?$, the pattern
// the proto declares for Money.amount.
func wellFormed(s string) bool {
	intPart, frac, hasPoint := strings.Cut(s, ".")
	return allDigits(intPart) && (!hasPoint || allDigits(frac))
}

// allDigits reports whether s is non-empty and only ASCII digits.
func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Sum returns the exact sum of the amounts. nil entries are zero. The
// first malformed amount is an error naming its index.
func Sum(ms ...*typesv1.Money) (decimal.Decimal, error) {
	total := decimal.Zero
	for i, m := range ms {
		d, err := Parse(m)
		if err != nil {
			return decimal.Decimal{}, fmt.Errorf("amount %d: %w", i, err)
		}
		total = total.Add(d)
	}
	return total, nil
}

// Add returns a + b as canonical Money. It fails, wrapping
// errs.InvalidArgument, when either amount is malformed or the sum is
// longer than MaxLen.
func Add(a, b *typesv1.Money) (*typesv1.Money, error) {
	sum, err := Sum(a, b)
	if err != nil {
		return nil, err
	}
	s, err := format(sum)
	if err != nil {
		return nil, fmt.Errorf("sum: %w", err)
	}
	return &typesv1.Money{Amount: s}, nil
}
