// Package money converts between layer0.types.v1.Money, a decimal string of
// US dollars, and shopspring/decimal values. Amounts are never floats:
// costs are summed over thousands of model calls and must stay exact.
//
// The wire form is digits with an optional point and fraction digits, no
// sign and no exponent ("0", "0.0125", "12"); the empty string means zero.
// FromDecimal writes the canonical form (no trailing fraction zeros, "0"
// for zero); Parse accepts any valid form and rejects the rest with an
// error wrapping errs.InvalidArgument.
package money
