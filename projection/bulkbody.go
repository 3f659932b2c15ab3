package projection

import (
	"encoding/json"
	"strconv"
	"strings"
)

// The bulk body is written here rather than by olivere's BulkService, which
// marshals every request twice (once to estimate the body's size, once to
// write it) and re-encodes each document it is given: a third of the
// daemon's CPU in a bulk drain. Here each payload's bytes are copied once,
// from the claimed row straight into the body.

// bulkAction is one event's part of a bulk body: its action line and, for
// an upsert, its document line.
type bulkAction struct {
	op      string // "index" or "delete"
	id      string // the document's _id, already checked
	version int64
	doc     []byte // the upsert's document, one line; nil for a delete
}

const (
	actionIndex  = "index"
	actionDelete = "delete"
)

// size is the bytes the action takes in the body.
func (a bulkAction) size() int {
	// {"index":{"_id":"…","version":N,"version_type":"external_gte"}}\n
	n := len(`{"":{"_id":,"version":,"version_type":""}}`) + 1 + len(a.op) + len(versionType) + len(a.id) + 2 + 20
	if a.op == actionIndex {
		n += len(a.doc) + 1
	}
	return n
}

// writeTo appends the action's lines to b.
func (a bulkAction) writeTo(b *strings.Builder) {
	var num [20]byte
	b.WriteString(`{"`)
	b.WriteString(a.op)
	b.WriteString(`":{"_id":`)
	writeJSONString(b, a.id)
	b.WriteString(`,"version":`)
	b.Write(strconv.AppendInt(num[:0], a.version, 10))
	b.WriteString(`,"version_type":"` + versionType + `"}}` + "\n")
	if a.op == actionIndex {
		b.Write(a.doc)
		b.WriteByte('\n')
	}
}

// writeJSONString writes s as a JSON string, as encoding/json would: ids are
// nearly always printable ASCII, written as they are; anything else takes
// encoding/json's escaping (and its replacement of invalid UTF-8).
func writeJSONString(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			quoted, _ := json.Marshal(s) // a string always marshals
			b.Write(quoted)
			return
		}
	}
	b.WriteByte('"')
	b.WriteString(s)
	b.WriteByte('"')
}

// bulkReply is what the engine answers to a bulk sent with filter_path
// errors,items.*.status,items.*.error: one item per action, in order, under
// the action's name.
type bulkReply struct {
	Items []bulkReplyItem `json:"items"`
}

type bulkReplyItem struct {
	Index  *bulkItemStatus `json:"index"`
	Create *bulkItemStatus `json:"create"`
	Update *bulkItemStatus `json:"update"`
	Delete *bulkItemStatus `json:"delete"`
}

// status is the item's answer, whatever its action; nil when it has none.
func (it bulkReplyItem) status() *bulkItemStatus {
	switch {
	case it.Index != nil:
		return it.Index
	case it.Delete != nil:
		return it.Delete
	case it.Create != nil:
		return it.Create
	}
	return it.Update
}

type bulkItemStatus struct {
	Status int `json:"status"`
	Error  *struct {
		Type   string `json:"type"`
		Reason string `json:"reason"`
	} `json:"error"`
}
