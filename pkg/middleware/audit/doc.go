// Package audit is the store-boundary audit log: one structured record per
// StateService Write or Delete, naming who (the authenticated principal),
// the scope, the key, the resulting revision and the outcome. Values are
// never logged. Reads are not audited (they change nothing).
package audit
