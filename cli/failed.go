package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/replay"
)

// failedFilterFlags are the failed-row filters shared by list and stats.
type failedFilterFlags struct {
	Projection string `help:"Only events of this projection."`
	Reason     string `help:"Only events with this error_reason (rate_limited, server_error, timeout, connection, mapping_error, ...)."`
	Since      string `help:"Only events that failed at or after this time: RFC3339, a date, or a duration like 24h or 7d meaning that long ago."`
	Until      string `help:"Only events that failed before this time (same forms as --since)."`
	EntityType string `name:"entity-type" help:"Only events of this entity type."`
	ScopeKey   string `name:"scope-key" help:"Only events with this scope key (e.g. a library id), to see the blast radius."`
	Archived   bool   `help:"Read the archived events (outbox_dead_letter) instead of the failed ones."`
}

func (f failedFilterFlags) filter(now time.Time) (replay.Filter, error) {
	since, err := parseTime("--since", f.Since, now)
	if err != nil {
		return replay.Filter{}, err
	}
	until, err := parseTime("--until", f.Until, now)
	if err != nil {
		return replay.Filter{}, err
	}
	return replay.Filter{Projection: f.Projection, Reason: f.Reason, Since: since, Until: until,
		EntityType: f.EntityType, ScopeKey: f.ScopeKey, Archived: f.Archived}, nil
}

// what names the events f reads, for messages.
func (f failedFilterFlags) what() string {
	if f.Archived {
		return "archived"
	}
	return "failed"
}

type failedCmd struct {
	List    failedListCmd    `cmd:"" help:"List failed events, newest failure first (or archived ones, newest id first)."`
	Stats   failedStatsCmd   `cmd:"" help:"Count failed (or archived) events by projection and reason, with the oldest and newest failure."`
	Discard failedDiscardCmd `cmd:"" help:"Close failed events for good (failed → discarded), audited."`
	Archive failedArchiveCmd `cmd:"" help:"Move failed and discarded events that failed long ago to outbox_dead_letter, audited."`
}

type failedListCmd struct {
	dbFlags
	failedFilterFlags
	Limit int  `help:"Show at most N events (0: all)." default:"${list_limit}" field:"Limit"`
	JSON  bool `name:"json" help:"Print one JSON object per event."`
}

func (c *failedListCmd) Run(g *globals) error {
	f, err := c.filter(time.Now())
	if err == nil && c.Limit < 0 {
		err = usagef("--limit must not be negative, got %d", c.Limit)
	}
	if err != nil {
		return commandError(c, err)
	}
	return opsRun(g, c, func(ctx context.Context, conn *pgx.Conn) error {
		events, err := listFailed(ctx, conn, f, c.Limit)
		if err != nil {
			return err
		}
		more := c.Limit > 0 && len(events) > c.Limit
		if more {
			events = events[:c.Limit]
		}
		switch {
		case c.JSON:
			return writeJSONLines(g.stdout, events)
		case len(events) == 0:
			fmt.Fprintf(g.stdout, "no %s events match\n", c.what())
			return nil
		}
		writeEvents(g.stdout, events)
		if more {
			fmt.Fprintf(g.stdout, "(first %d shown; --limit 0 lists all)\n", c.Limit)
		}
		return nil
	})
}

// listFailed reads the rows f matches, newest first, a page per statement
// (replay.ListPage), up to limit (0: all) and one more, which tells whether
// the listing was cut: one statement reading every failed row took 1.5 s
// for 200,000 of them. The dead letter is listed by id, newest first: it
// has no index by time of failure, and a page in that order would sort it
// whole.
func listFailed(ctx context.Context, db *pgx.Conn, f replay.Filter, limit int) ([]replay.FailedEvent, error) {
	order := replay.SortDefault
	if f.Archived {
		order = replay.Sort{Key: replay.SortID}
	}
	var events []replay.FailedEvent
	var after *replay.Cursor
	for {
		size := replay.PageSizeRange.Max
		if limit > 0 {
			size = min(size, limit+1-len(events))
		}
		p, err := replay.ListPage(ctx, db, replay.PageRequest{Filter: f, Sort: order, After: after, Size: size})
		if err != nil {
			return nil, err
		}
		events = append(events, p.Events...)
		if p.Next == nil || (limit > 0 && len(events) > limit) {
			return events, nil
		}
		after = p.Next
	}
}

type failedStatsCmd struct {
	dbFlags
	failedFilterFlags
	JSON bool `name:"json" help:"Print one JSON object per projection and reason."`
}

func (c *failedStatsCmd) Run(g *globals) error {
	f, err := c.filter(time.Now())
	if err != nil {
		return commandError(c, err)
	}
	return opsRun(g, c, func(ctx context.Context, conn *pgx.Conn) error {
		stats, err := replay.Stats(ctx, conn, f)
		switch {
		case err != nil:
			return err
		case c.JSON:
			return writeJSONLines(g.stdout, stats)
		case len(stats) == 0:
			fmt.Fprintf(g.stdout, "no %s events match\n", c.what())
			return nil
		}
		tw := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PROJECTION\tREASON\tCLASS\tCOUNT\tOLDEST\tNEWEST")
		var total int64
		for _, s := range stats {
			total += s.Count
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", s.Projection, dash(s.Reason), dash(s.Class), s.Count,
				formatTime(s.Oldest), formatTime(s.Newest))
		}
		tw.Flush()
		fmt.Fprintf(g.stdout, "total: %d %s events\n", total, c.what())
		return nil
	})
}

// auditFlags are what every audited command takes.
type auditFlags struct {
	dbFlags
	By     string `help:"Who is acting; recorded in the audit row. Required." placeholder:"WHO" field:"By"`
	Why    string `help:"Why, e.g. the fix that was made or the ticket; recorded in the audit row. Required." placeholder:"TEXT" field:"Why"`
	DryRun bool   `name:"dry-run" help:"Print exactly the events that would change, and change nothing."`
	JSON   bool   `name:"json" help:"Print the report as one JSON object."`
}

// selectFlags name rows by id, reason and projection.
type selectFlags struct {
	IDs        string `name:"ids" help:"Comma list of event ids, ranges allowed (1,2,10-20). Every id must exist and be in a status the command takes, or nothing changes." field:"IDs"`
	Reason     string `help:"Only events with this error_reason."`
	Projection string `help:"Only events of this projection."`
}

// actionFlags are the selectors and guards of replay and discard.
type actionFlags struct {
	auditFlags
	selectFlags
	Since string `help:"Only events that failed at or after this time: RFC3339, a date, or a duration like 24h meaning that long ago."`
	Until string `help:"Only events that failed before this time (same forms as --since)."`
	Limit int    `help:"Change at most N events, lowest ids first (0: no limit)." field:"Limit"`
	Max   int    `help:"Refuse without --ids when more events than this match, unless --yes." default:"${replay_max}" field:"Max"`
	Yes   bool   `help:"Go ahead even when more than --max events match."`
}

// check refuses a command without --by or --why before it connects.
func (f auditFlags) check(doing string) error {
	if strings.TrimSpace(f.By) == "" || strings.TrimSpace(f.Why) == "" {
		return &replay.AuditRequiredError{Doing: doing}
	}
	return nil
}

// given records the selector flags as typed, for the audit row.
func given(flags map[string]string) map[string]string {
	out := map[string]string{}
	for flag, v := range flags {
		if v != "" {
			out[flag] = v
		}
	}
	return out
}

// request turns the flags into a replay.Request; nothing is read yet.
func (f actionFlags) request(doing string, now time.Time) (replay.Request, error) {
	req := replay.Request{Reason: f.Reason, Projection: f.Projection, Limit: f.Limit, By: f.By, Why: f.Why,
		DryRun: f.DryRun, Max: f.Max, Yes: f.Yes}
	if err := f.check(doing); err != nil {
		return req, err
	}
	if f.Max <= 0 {
		return req, usagef("--max must be positive, got %d", f.Max)
	}
	var err error
	if req.IDs, err = parseIDs(f.IDs); err != nil {
		return req, err
	}
	if req.Since, err = parseTime("--since", f.Since, now); err != nil {
		return req, err
	}
	if req.Until, err = parseTime("--until", f.Until, now); err != nil {
		return req, err
	}
	req.Given = given(map[string]string{"ids": f.IDs, "reason": f.Reason, "projection": f.Projection,
		"since": f.Since, "until": f.Until})
	if f.Limit > 0 {
		req.Given["limit"] = strconv.Itoa(f.Limit)
	}
	return req, nil
}

// parseTime reads a --since/--until value (replay.ParseTime).
func parseTime(flag, v string, now time.Time) (time.Time, error) {
	t, err := replay.ParseTime(v, now)
	if err != nil {
		return time.Time{}, usagef("%s: %w", flag, err)
	}
	return t, nil
}

func parseIDs(s string) ([]int64, error) {
	if s == "" {
		return nil, nil
	}
	ids, err := replay.ParseIDs(s)
	if err != nil {
		return nil, usagef("--ids: %w", err)
	}
	return ids, nil
}

// run parses the flags, then reports what do did with them.
func (f actionFlags) run(g *globals, doing string, words reportWords,
	do func(context.Context, replay.Beginner, replay.Request) (replay.Report, error), resetAttempts bool,
) error {
	req, err := f.request(doing, time.Now())
	if err != nil {
		return commandError(f, err)
	}
	req.ResetAttempts = resetAttempts
	return f.report(g, f, words, func(ctx context.Context, conn *pgx.Conn) (replay.Report, error) {
		return do(ctx, conn, req)
	})
}

// reportWords say what an action does, in its report lines.
type reportWords struct {
	rows string // the rows it takes: "failed"
	done string // its past participle: "replayed"
	to   string // where rows go: " to pending"
}

// report runs do and prints its report: as JSON with --json (also on a
// refusal, so scripts see the ids), else the rows and a summary line.
func (f auditFlags) report(g *globals, cmd dbCommand, words reportWords,
	do func(context.Context, *pgx.Conn) (replay.Report, error),
) error {
	return opsRun(g, cmd, func(ctx context.Context, conn *pgx.Conn) error {
		rep, err := do(ctx, conn)
		var refused *replay.RefusedError
		if err != nil && !errors.As(err, &refused) {
			return err
		}
		if f.JSON {
			if rep.Events == nil {
				rep.Events = []replay.FailedEvent{}
			}
			if jerr := writeJSONLines(g.stdout, []replay.Report{rep}); jerr != nil {
				return jerr
			}
			return err
		}
		if err != nil {
			return err
		}
		writeReport(g.stdout, rep, words)
		return nil
	})
}

func writeReport(w io.Writer, rep replay.Report, words reportWords) {
	if len(rep.Skipped) > 0 {
		fmt.Fprintf(w, "skipped (%s, but left out by the other selectors or --limit): %s\n", words.rows, replay.FormatIDs(rep.Skipped))
	}
	if len(rep.Events) == 0 {
		fmt.Fprintf(w, "no %s events match; nothing %s\n", words.rows, words.done)
		return
	}
	writeEvents(w, rep.Events)
	ids := replay.FormatIDs(rep.IDs())
	if rep.DryRun {
		fmt.Fprintf(w, "dry run: %d events would be %s (ids %s); nothing changed\n", len(rep.Events), words.done, ids)
		return
	}
	audit := fmt.Sprintf("audit id %d", rep.AuditID)
	if len(rep.AuditIDs) > 1 {
		audit = "audit ids " + replay.FormatIDs(rep.AuditIDs)
	}
	fmt.Fprintf(w, "%s %d events (ids %s)%s; %s\n", words.done, len(rep.Events), ids, words.to, audit)
}

type replayCmd struct {
	actionFlags
	ResetAttempts bool `name:"reset-attempts" help:"Zero the attempts counter (kept by default; a replayed event always gets one more try)."`
	Archived      bool `help:"Bring archived events back from outbox_dead_letter, by --ids only, as pending under the same ids."`
}

func (c *replayCmd) Help() string {
	return "Selectors combine with AND. The replay is one transaction and writes one audit row; with --yes and no --limit, " +
		"transactions of " + strconv.Itoa(replay.BatchDefault) + " events, oldest failure first, each with its own audit row. " +
		"--archived brings events back from outbox_dead_letter by --ids, as pending under the same ids; " +
		"it inserts events, so run it as the owner role. " +
		"Exit codes: 0 done (or nothing matched), 1 error, 2 incomplete command, 3 refused with nothing changed."
}

func (c *replayCmd) Run(g *globals) error {
	do, words := replay.Replay, reportWords{rows: "failed", done: "replayed", to: " to pending"}
	if c.Archived {
		do, words = replay.Restore, reportWords{rows: "archived", done: "restored", to: " to pending"}
	}
	return c.run(g, "replaying", words, do, c.ResetAttempts)
}

type failedDiscardCmd struct {
	actionFlags
}

func (c *failedDiscardCmd) Help() string {
	return "Discarded is terminal: nothing revives it, and failed archive moves it out of the outbox. " +
		"Selectors combine with AND; one transaction, one audit row (with --yes and no --limit, transactions of " +
		strconv.Itoa(replay.BatchDefault) + " events, each with its own). " +
		"Exit codes: 0 done (or nothing matched), 1 error, 2 incomplete command, 3 refused with nothing changed."
}

func (c *failedDiscardCmd) Run(g *globals) error {
	return c.run(g, "discarding", reportWords{rows: "failed", done: "discarded"}, replay.Discard, false)
}

type failedArchiveCmd struct {
	auditFlags
	selectFlags
	OlderThan string `name:"older-than" required:"" help:"Move events that failed longer ago than this: a duration like 720h or 30d." placeholder:"DURATION" field:"OlderThan"`
}

func (c *failedArchiveCmd) Help() string {
	return "Moves failed and discarded events, every column kept, to outbox_dead_letter, in transactions of " +
		strconv.Itoa(replay.BatchDefault) + " events, each with its own audit row; with --ids (at most as many), one transaction. " +
		"wlproj replay --archived --ids brings them back. Exit codes as wlproj replay."
}

func (c *failedArchiveCmd) Run(g *globals) error {
	req, err := c.request()
	if err != nil {
		return commandError(c, err)
	}
	words := reportWords{rows: "failed or discarded", done: "archived", to: " to outbox_dead_letter"}
	return c.report(g, c, words, func(ctx context.Context, conn *pgx.Conn) (replay.Report, error) {
		return replay.Archive(ctx, conn, req)
	})
}

func (c *failedArchiveCmd) request() (replay.ArchiveRequest, error) {
	req := replay.ArchiveRequest{Projection: c.Projection, Reason: c.Reason, By: c.By, Why: c.Why, DryRun: c.DryRun,
		Given: given(map[string]string{"older-than": c.OlderThan, "ids": c.IDs, "reason": c.Reason, "projection": c.Projection})}
	if err := c.check("archiving"); err != nil {
		return req, err
	}
	d, ok := replay.ParseAgo(strings.TrimSpace(c.OlderThan))
	if !ok {
		return req, usagef("--older-than: %q is not a duration like 720h or 30d", c.OlderThan)
	}
	req.OlderThan = d
	var err error
	req.IDs, err = parseIDs(c.IDs)
	return req, err
}

// writeEvents prints events as a table; the status and archive time show
// only where they tell something (a listing of failed rows is all failed).
func writeEvents(w io.Writer, events []replay.FailedEvent) {
	var status, archived bool
	for _, e := range events {
		status = status || e.Status != "failed"
		archived = archived || !e.ArchivedAt.IsZero()
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "ID\tPROJECTION\tENTITY\tOP\tATTEMPTS\tREPLAYS\tREASON\tSCOPE\tFAILED_AT\t")
	fmt.Fprint(tw, optional(status, "STATUS\t"), optional(archived, "ARCHIVED_AT\t"))
	fmt.Fprintln(tw, "LAST_ERROR")
	for _, e := range events {
		fmt.Fprintf(tw, "%d\t%s\t%s/%s\t%s\t%d\t%d\t%s\t%s\t%s\t", e.ID, e.Projection, e.EntityType, e.EntityID,
			e.Op, e.Attempts, e.ReplayCount, dash(e.ErrorReason), dash(e.ScopeKey), formatTime(e.UpdatedAt))
		fmt.Fprint(tw, optional(status, e.Status+"\t"), optional(archived, formatTime(e.ArchivedAt)+"\t"))
		fmt.Fprintln(tw, snippet(e.LastError, lastErrorColumn))
	}
	tw.Flush()
}
