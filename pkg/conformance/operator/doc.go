// Package operator is the conformance suite of
// layer0.operator.v1.OperatorService.
package operator
