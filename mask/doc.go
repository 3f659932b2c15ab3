// Package mask hides fields of event payloads wherever a payload, or an
// error that may quote one, is shown: the console, the CLI, logs, traces
// and the stored error text. It never touches what is sent to an engine.
//
// A path names fields from the payload's root with dots: "email",
// "address.city". A segment "*" is any field at that level, so
// "address.*" is every field under address. Arrays are looked through: a
// path applies to every element of an array at any depth without a
// segment of its own ("contacts.email" masks the email of each contact in
// a contacts array). A path that ends on an object or array masks every
// value under it. A field whose name holds a dot cannot be named; mask
// its parent.
//
// Payload replaces each masked value (strings, numbers, booleans, null)
// with Marker and keeps the structure. Text removes from a text every
// form a masked value may take in it (as is, JSON-escaped, Go- and
// ASCII-quoted, a number's other spellings, and the start of one where a
// text was cut short), so an engine error that quotes a refused value is
// masked without parsing the engine's message. It masks too much rather
// than too little: a masked "1" takes every 1 out of the text.
package mask
