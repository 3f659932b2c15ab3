package cli

import (
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/schollz/progressbar/v3"

	"github.com/wlproj/wlproj/rebuild"
)

// reasons is "mapping_error 3, payload_invalid 1", most first.
func reasons(by map[string]int64) string {
	type rc struct {
		r string
		n int64
	}
	var list []rc
	for r, n := range by {
		list = append(list, rc{r, n})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].n > list[j].n || (list[i].n == list[j].n && list[i].r < list[j].r) })
	parts := make([]string, len(list))
	for i, x := range list {
		parts[i] = fmt.Sprintf("%s %d", x.r, x.n)
	}
	return strings.Join(parts, ", ")
}

// rebuildOutput shows a rebuild's progress: on a terminal a bar with rate
// and ETA (progressbar, on stderr) and text on stdout; otherwise one JSON
// object per line on stdout, for logs and scripts.
type rebuildOutput struct {
	w    io.Writer
	json bool

	mu      sync.Mutex
	bar     *progressbar.ProgressBar
	phase   string
	total   int64
	count   int64
	started time.Time
	printed time.Time
}

// rebuildBarTo is where the bar is drawn; tests silence it.
var rebuildBarTo io.Writer = os.Stderr

// jsonProgressEvery spaces the JSON progress lines.
const jsonProgressEvery = time.Second

func newRebuildOutput(w io.Writer, mode string, quiet bool) *rebuildOutput {
	json := mode == "json" || (mode == "auto" && !isatty.IsTerminal(os.Stderr.Fd()))
	if quiet && mode == "auto" {
		json = false
	}
	return &rebuildOutput{w: w, json: json}
}

// Phase implements rebuild.Progress.
func (o *rebuildOutput) Phase(name string, total int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.finishBar()
	o.phase, o.total, o.count, o.started = name, total, 0, time.Now()
	if o.json {
		o.progressLine()
		return
	}
	o.bar = progressbar.NewOptions64(total, progressbar.OptionSetWriter(rebuildBarTo), progressbar.OptionSetDescription(name),
		progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("rows"),
		progressbar.OptionSetPredictTime(true), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionFullWidth())
}

// Add implements rebuild.Progress.
func (o *rebuildOutput) Add(n int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.show(o.count + n)
}

// Set implements rebuild.Progress.
func (o *rebuildOutput) Set(n int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.show(n)
}

// show makes n the count done and shows it; called with o.mu held.
func (o *rebuildOutput) show(n int64) {
	o.count = n
	if o.bar != nil {
		_ = o.bar.Set64(n)
	}
	if o.json && (time.Since(o.printed) >= jsonProgressEvery || n == o.total) {
		o.progressLine()
	}
}

func (o *rebuildOutput) progressLine() {
	secs := time.Since(o.started).Seconds()
	line := map[string]any{"event": "progress", "phase": o.phase, "done": o.count, "total": o.total}
	if secs > 0 && o.count > 0 {
		rate := float64(o.count) / secs
		line["rows_per_second"] = math.Round(rate)
		line["eta_seconds"] = math.Round(float64(o.total-o.count)/rate*10) / 10
	}
	writeJSON(o.w, line)
	o.printed = time.Now()
}

func (o *rebuildOutput) finishBar() {
	if o.bar != nil {
		_ = o.bar.Finish()
		fmt.Fprintln(rebuildBarTo)
		o.bar = nil
	}
}

// Note implements rebuild.Progress.
func (o *rebuildOutput) Note(msg string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.json {
		writeJSON(o.w, map[string]any{"event": "note", "message": msg})
		return
	}
	if o.bar != nil {
		_ = o.bar.Clear()
	}
	fmt.Fprintln(o.w, msg)
}

// refused reports one refused row as it is found.
func (o *rebuildOutput) refused(r rebuild.Refused) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.json {
		writeJSON(o.w, map[string]any{"event": "refused", "row": r})
		return
	}
	if o.bar != nil {
		_ = o.bar.Clear()
	}
	fmt.Fprintf(o.w, "refused %s:%s version %d: %s: %s\n", r.EntityType, r.EntityID, r.Version, r.Reason, r.Message)
}

func (o *rebuildOutput) done(rep rebuild.Report, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.finishBar()
	if err != nil && rep.Rebuild.ID == 0 {
		return
	}
	if o.json {
		writeJSON(o.w, map[string]any{"event": "done", "ok": err == nil, "report": rep})
		return
	}
	if err != nil {
		return // the error says where it stopped and what to do
	}
	r := rep.Rebuild
	rate := 0.0
	if rep.Seconds > 0 {
		rate = float64(rep.Loaded+rep.Superseded+rep.Refused) / rep.Seconds
	}
	fmt.Fprintf(o.w, "rebuild #%d done: %d source rows from %s into %s in %.1fs (%.0f rows/s)\n",
		r.ID, rep.Rows, r.SourceTable, r.Target, rep.Seconds, rate)
	fmt.Fprintf(o.w, "  loaded %d, superseded %d (the ledger or the index had newer), refused %d\n", rep.Loaded, rep.Superseded, rep.Refused)
	if rep.Refused > 0 {
		fmt.Fprintf(o.w, "  refused by reason: %s\n", reasons(rep.RefusedByReason))
	}
	if rep.Behind > 0 {
		fmt.Fprintf(o.w, "  %d source rows were older than the version the ledger applied (the table missed their newest write): "+
			"%d copied from %s at its version; fix the application that writes %s\n", rep.Behind, rep.Copied, dash(r.OldIndex), r.SourceTable)
	}
	if rep.Lost > 0 {
		fmt.Fprintf(o.w, "  swapped with --allow-refused: %s lacks %d documents %s had: %s\n", r.Target, rep.Lost, dash(r.OldIndex),
			strings.Join(rep.LostIDs, ", "))
	}
	fmt.Fprintf(o.w, "  %s had %d documents before the swap; %s has %d\n", r.Alias, rep.DocsBefore, r.Target, rep.DocsAfter)
}

func (o *rebuildOutput) plan(p rebuild.Plan) {
	if o.json {
		writeJSON(o.w, map[string]any{"event": "dry_run", "plan": p})
		return
	}
	for _, line := range p.Steps {
		fmt.Fprintln(o.w, line)
	}
	fmt.Fprintln(o.w, "dry run: nothing changed")
}

func (o *rebuildOutput) aborted(r rebuild.Row) {
	if o.json {
		writeJSON(o.w, map[string]any{"event": "aborted", "rebuild": r})
		return
	}
	fmt.Fprintf(o.w, "aborted rebuild #%d: %s still points at %s; the leader stops writing to %s, "+
		"which wlproj rebuild --cleanup deletes\n", r.ID, r.Alias, dash(r.OldIndex), r.Target)
}

func (o *rebuildOutput) rolledBack(r rebuild.Row) {
	if o.json {
		writeJSON(o.w, map[string]any{"event": "rolled_back", "rebuild": r})
		return
	}
	fmt.Fprintf(o.w, "rolled back rebuild #%d: %s points at %s again; the leader stops writing to %s, "+
		"which wlproj rebuild --cleanup deletes\n", r.ID, r.Alias, r.OldIndex, r.Target)
}

func (o *rebuildOutput) cleaned(done []rebuild.Cleaned) {
	for _, c := range done {
		if o.json {
			writeJSON(o.w, map[string]any{"event": "cleaned", "cleaned": c})
			continue
		}
		if c.Released != "" {
			fmt.Fprintf(o.w, "rebuild #%d: %s\n", c.Rebuild.ID, c.Note)
			continue
		}
		if c.Deleted != "" {
			fmt.Fprintf(o.w, "rebuild #%d: deleted index %s\n", c.Rebuild.ID, c.Deleted)
		} else {
			fmt.Fprintf(o.w, "rebuild #%d: closed; no index of it was left to delete\n", c.Rebuild.ID)
		}
	}
}
