// Package boltcheck inspects a bbolt file before bbolt maps it, so that a
// damaged file is refused at start with one clear error instead of a
// SIGBUS at open (a crash loop) or a panic on every later write.
//
// bbolt itself trusts its file: it maps it and follows page ids with
// unchecked pointer arithmetic, so a file cut short faults on the first
// read past its end, and a page overwritten with garbage panics or
// faults wherever it is read. Check reads the file with ordinary,
// bounds-checked reads instead:
//
//   - both meta pages (magic, version, FNV checksum, sane fields), as
//     bbolt would pick them;
//   - every page reachable from the root bucket (the same walk as bbolt's
//     tx.Check), and the freelist page when the file keeps one: that the
//     file holds it (a file cut short inside a page in use is refused
//     before anything maps it), its id and type, that it lies below the
//     high-water mark, that its elements lie inside it, that its keys are
//     sorted, that no page is reached twice or is also listed as free.
//
// A file shorter than the chosen meta's high-water mark (pgid × page
// size) whose missing pages are all free loses nothing: bbolt never
// reads a free page and extends the file again. Check accepts it and
// reports it (Report.Short) to be logged as a warning.
//
// It does not run bbolt's own tx.Check: that walks the mapped file
// through the same unchecked pointers, so it faults on a file cut short
// (SIGBUS, which no recover catches) and panics on a garbage page. bbolt
// stores no checksum of data pages, so a changed byte inside a value is
// not detectable here or anywhere.
//
// One meta page invalid is not refused: bbolt opens the file at the
// other, which is exactly how it recovers from a crash in the middle of a
// commit (the torn meta was never acknowledged). Check reports it as a
// Fallback so that the service logs it loudly: if the damaged page held
// the newer transaction, the writes acknowledged in it are missing.
//
// The check holds a shared lock on the file (the same flock bbolt
// uses), so it never reads a file another process is writing.
package boltcheck
