package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/replay"
)

// Exit codes of the operator commands, beyond 0 and kong's own 2 for a flag
// it cannot parse.
const (
	exitFailure = 1 // the database or something else failed
	exitUsage   = 2 // the command is incomplete or a flag value is wrong
	exitRefused = 3 // replay looked at the rows and refused; nothing changed
)

const (
	connectTimeoutDefault = 10 * time.Second
	listLimitDefault      = 100
	lastErrorColumn       = 60
)

// usageError is a flag value the command cannot use.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// failedFilterFlags are the failed-row filters shared by list and stats.
type failedFilterFlags struct {
	Projection string `help:"Only events of this projection."`
	Reason     string `help:"Only events with this error_reason (rate_limited, server_error, timeout, connection, mapping_error, ...)."`
	Since      string `help:"Only events that failed at or after this time: RFC3339, a date, or a duration like 24h or 7d meaning that long ago."`
	Until      string `help:"Only events that failed before this time (same forms as --since)."`
	EntityType string `name:"entity-type" help:"Only events of this entity type."`
	ScopeKey   string `name:"scope-key" help:"Only events with this scope key (e.g. a library id), to see the blast radius."`
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
		EntityType: f.EntityType, ScopeKey: f.ScopeKey}, nil
}

type failedCmd struct {
	List  failedListCmd  `cmd:"" help:"List failed events, newest failure first."`
	Stats failedStatsCmd `cmd:"" help:"Count failed events by projection and reason, with the oldest and newest failure."`
}

type failedListCmd struct {
	dbFlags
	failedFilterFlags
	Limit int  `help:"Show at most N events (0: all)." default:"100"`
	JSON  bool `name:"json" help:"Print one JSON object per event."`
}

func (c *failedListCmd) Run(g *globals) error {
	return opsRun(c.DatabaseURL, func(ctx context.Context, conn *pgx.Conn) error {
		f, err := c.filter(time.Now())
		if err != nil {
			return err
		}
		if c.Limit < 0 {
			return usagef("--limit must not be negative, got %d", c.Limit)
		}
		// One row past the limit tells whether the listing was cut.
		if c.Limit > 0 {
			f.Limit = c.Limit + 1
		}
		events, err := replay.List(ctx, conn, f)
		if err != nil {
			return err
		}
		more := c.Limit > 0 && len(events) > c.Limit
		if more {
			events = events[:c.Limit]
		}
		if c.JSON {
			return writeJSONLines(g.stdout, events)
		}
		if len(events) == 0 {
			fmt.Fprintln(g.stdout, "no failed events match")
			return nil
		}
		writeEvents(g.stdout, events)
		if more {
			fmt.Fprintf(g.stdout, "(first %d shown; --limit 0 lists all)\n", c.Limit)
		}
		return nil
	})
}

type failedStatsCmd struct {
	dbFlags
	failedFilterFlags
	JSON bool `name:"json" help:"Print one JSON object per projection and reason."`
}

func (c *failedStatsCmd) Run(g *globals) error {
	return opsRun(c.DatabaseURL, func(ctx context.Context, conn *pgx.Conn) error {
		f, err := c.filter(time.Now())
		if err != nil {
			return err
		}
		stats, err := replay.Stats(ctx, conn, f)
		if err != nil {
			return err
		}
		if c.JSON {
			return writeJSONLines(g.stdout, stats)
		}
		if len(stats) == 0 {
			fmt.Fprintln(g.stdout, "no failed events match")
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
		fmt.Fprintf(g.stdout, "total: %d failed events\n", total)
		return nil
	})
}

type replayCmd struct {
	dbFlags
	By            string `help:"Who is replaying; recorded in the audit row. Required." placeholder:"WHO"`
	Why           string `help:"Why, e.g. the fix that was made; recorded in the audit row. Required." placeholder:"TEXT"`
	IDs           string `name:"ids" help:"Comma list of event ids, ranges allowed (1,2,10-20). Every id must exist and be failed, or nothing is replayed."`
	Reason        string `help:"Only events with this error_reason."`
	Projection    string `help:"Only events of this projection."`
	Since         string `help:"Only events that failed at or after this time: RFC3339, a date, or a duration like 24h meaning that long ago."`
	Until         string `help:"Only events that failed before this time (same forms as --since)."`
	Limit         int    `help:"Replay at most N events, lowest ids first (0: no limit)."`
	DryRun        bool   `name:"dry-run" help:"Print exactly the events that would be replayed, and change nothing."`
	ResetAttempts bool   `name:"reset-attempts" help:"Zero the attempts counter (kept by default; a replayed event always gets one more try)."`
	Max           int    `help:"Refuse a replay without --ids that would touch more events than this, unless --yes." default:"1000"`
	Yes           bool   `help:"Go ahead even when more than --max events match."`
	JSON          bool   `name:"json" help:"Print the report as one JSON object."`
}

func (c *replayCmd) Help() string {
	return "Selectors combine with AND. The replay is one transaction and writes one audit row. " +
		"Exit codes: 0 done (or nothing matched), 1 error, 2 incomplete command, 3 refused with nothing changed."
}

func (c *replayCmd) Run(g *globals) error {
	// Check the audit fields before touching the database, so a bare
	// `wlproj replay` never even connects.
	if strings.TrimSpace(c.By) == "" || strings.TrimSpace(c.Why) == "" {
		return opsError(replay.ErrAuditRequired, c.DatabaseURL)
	}
	return opsRun(c.DatabaseURL, func(ctx context.Context, conn *pgx.Conn) error {
		now := time.Now()
		req := replay.Request{
			Reason: c.Reason, Projection: c.Projection, Limit: c.Limit, By: c.By, Why: c.Why,
			DryRun: c.DryRun, ResetAttempts: c.ResetAttempts, Max: c.Max, Yes: c.Yes,
			Given: map[string]string{},
		}
		if c.Max <= 0 {
			return usagef("--max must be positive, got %d", c.Max)
		}
		var err error
		if c.IDs != "" {
			if req.IDs, err = replay.ParseIDs(c.IDs); err != nil {
				return usageError{err}
			}
		}
		if req.Since, err = parseTime("--since", c.Since, now); err != nil {
			return err
		}
		if req.Until, err = parseTime("--until", c.Until, now); err != nil {
			return err
		}
		for flag, v := range map[string]string{"ids": c.IDs, "reason": c.Reason, "projection": c.Projection,
			"since": c.Since, "until": c.Until} {
			if v != "" {
				req.Given[flag] = v
			}
		}
		if c.Limit > 0 {
			req.Given["limit"] = strconv.Itoa(c.Limit)
		}

		rep, err := replay.Replay(ctx, conn, req)
		var refused *replay.RefusedError
		if err != nil && !errors.As(err, &refused) {
			return err
		}
		if c.JSON {
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
		writeReplay(g.stdout, rep)
		return nil
	})
}

func writeReplay(w io.Writer, rep replay.Report) {
	if len(rep.Skipped) > 0 {
		fmt.Fprintf(w, "skipped (failed, but left out by the other selectors or --limit): %s\n", replay.FormatIDs(rep.Skipped))
	}
	if len(rep.Events) == 0 {
		fmt.Fprintln(w, "no failed events match; nothing replayed")
		return
	}
	writeEvents(w, rep.Events)
	if rep.DryRun {
		fmt.Fprintf(w, "dry run: %d events would be replayed (ids %s); nothing changed\n",
			len(rep.Events), replay.FormatIDs(rep.IDs()))
		return
	}
	fmt.Fprintf(w, "replayed %d events (ids %s) to pending; audit id %d\n",
		len(rep.Events), replay.FormatIDs(rep.IDs()), rep.AuditID)
}

type statusCmd struct {
	dbFlags
	MaxProcessingSeconds float64 `name:"max-processing-seconds" help:"A processing event older than this counts as stuck, even with a live lease." env:"OUTBOX_MAX_PROCESSING_SECONDS" default:"300"`
	Exact                bool    `help:"Count done events exactly; this reads the whole table. Without it the done count is an estimate."`
	JSON                 bool    `name:"json" help:"Print one JSON object."`
}

// statusJSON is the --json shape of status: durations in seconds, so any
// tool can read them.
type statusJSON struct {
	TakenAt                 time.Time         `json:"taken_at"`
	Counts                  map[string]int64  `json:"counts"`
	DoneExact               bool              `json:"done_exact"`
	Lag                     int64             `json:"lag"`
	OldestPendingAgeSeconds float64           `json:"oldest_pending_age_seconds"`
	InFlight                int64             `json:"in_flight"`
	Stuck                   int64             `json:"stuck"`
	MaxProcessingSeconds    float64           `json:"max_processing_seconds"`
	TopFailedReasons        []reasonCountJSON `json:"top_failed_reasons"`
	Leader                  *leaderJSON       `json:"leader"`
}

type reasonCountJSON struct {
	Projection string `json:"projection"`
	Reason     string `json:"reason"`
	Count      int64  `json:"count"`
}

type leaderJSON struct {
	Name     string    `json:"name"`
	WorkerID string    `json:"worker_id"`
	Epoch    int64     `json:"epoch"`
	Since    time.Time `json:"since"`
	Active   bool      `json:"active"`
}

func (c *statusCmd) Run(g *globals) error {
	return opsRun(c.DatabaseURL, func(ctx context.Context, conn *pgx.Conn) error {
		if c.MaxProcessingSeconds <= 0 {
			return usagef("--max-processing-seconds (OUTBOX_MAX_PROCESSING_SECONDS) must be positive, got %g", c.MaxProcessingSeconds)
		}
		maxProcessing := seconds(c.MaxProcessingSeconds)
		s, err := outbox.TakeSnapshotWith(ctx, conn, outbox.SnapshotOptions{MaxProcessing: maxProcessing, ExactDone: c.Exact})
		if err != nil {
			return err
		}
		if c.JSON {
			out := statusJSON{
				TakenAt: s.TakenAt.UTC(), Counts: s.Counts, DoneExact: s.DoneExact, Lag: s.Lag,
				OldestPendingAgeSeconds: s.OldestPendingAge.Seconds(), InFlight: s.InFlight, Stuck: s.Stuck,
				MaxProcessingSeconds: c.MaxProcessingSeconds, TopFailedReasons: []reasonCountJSON{},
			}
			for _, r := range s.TopFailedReasons {
				out.TopFailedReasons = append(out.TopFailedReasons, reasonCountJSON(r))
			}
			if l := s.Leader; l != nil {
				out.Leader = &leaderJSON{Name: l.Name, WorkerID: l.Holder, Epoch: l.Epoch, Since: l.AcquiredAt.UTC(), Active: l.Active}
			}
			return writeJSONLines(g.stdout, []statusJSON{out})
		}
		writeStatus(g.stdout, s, maxProcessing, databaseTarget(conn))
		return nil
	})
}

func writeStatus(w io.Writer, s outbox.Snapshot, maxProcessing time.Duration, target string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "database\t%s\n", target)
	fmt.Fprintf(tw, "at\t%s\n", formatTime(s.TakenAt))
	for _, st := range []string{outbox.StatusPending, outbox.StatusProcessing, outbox.StatusDone, outbox.StatusFailed} {
		note := ""
		if st == outbox.StatusDone && !s.DoneExact {
			note = " (estimate; --exact counts)"
		}
		fmt.Fprintf(tw, "%s\t%d%s\n", st, s.Counts[st], note)
	}
	oldest := "nothing pending"
	if s.Lag > 0 {
		oldest = "oldest " + formatAge(s.OldestPendingAge)
	}
	fmt.Fprintf(tw, "lag\t%d pending, %s\n", s.Lag, oldest)
	fmt.Fprintf(tw, "in flight\t%d\n", s.InFlight)
	fmt.Fprintf(tw, "stuck\t%d (lease expired or processing longer than %s)\n", s.Stuck, maxProcessing)
	switch l := s.Leader; {
	case l == nil:
		fmt.Fprintf(tw, "leader\tnone has ever led\n")
	case l.Active:
		fmt.Fprintf(tw, "leader\t%s, epoch %d, since %s (%s ago)\n", l.Holder, l.Epoch, formatTime(l.AcquiredAt),
			formatAge(s.TakenAt.Sub(l.AcquiredAt)))
	default:
		fmt.Fprintf(tw, "leader\tnone active; last was %s, epoch %d, from %s\n", l.Holder, l.Epoch, formatTime(l.AcquiredAt))
	}
	tw.Flush()
	if len(s.TopFailedReasons) == 0 {
		return
	}
	fmt.Fprintln(w, "top failed reasons:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  PROJECTION\tREASON\tCOUNT")
	for _, r := range s.TopFailedReasons {
		fmt.Fprintf(tw, "  %s\t%s\t%d\n", r.Projection, dash(r.Reason), r.Count)
	}
	tw.Flush()
}

// databaseTarget names the database without credentials, for the status
// header: which database an operator is looking at matters.
func databaseTarget(conn *pgx.Conn) string {
	cfg := conn.Config()
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}

func writeEvents(w io.Writer, events []replay.FailedEvent) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROJECTION\tENTITY\tOP\tATTEMPTS\tREPLAYS\tREASON\tSCOPE\tFAILED_AT\tLAST_ERROR")
	for _, e := range events {
		fmt.Fprintf(tw, "%d\t%s\t%s/%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", e.ID, e.Projection, e.EntityType, e.EntityID,
			e.Op, e.Attempts, e.ReplayCount, dash(e.ErrorReason), dash(e.ScopeKey), formatTime(e.UpdatedAt),
			snippet(e.LastError, lastErrorColumn))
	}
	tw.Flush()
}

func writeJSONLines[T any](w io.Writer, items []T) error {
	enc := json.NewEncoder(w)
	for _, it := range items {
		if err := enc.Encode(it); err != nil {
			return err
		}
	}
	return nil
}

// opsRun connects, runs fn, and turns its error into an exit code with the
// database credentials scrubbed from the message.
func opsRun(databaseURL string, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	conn, err := connect(ctx, databaseURL)
	if err != nil {
		return opsError(err, databaseURL)
	}
	defer conn.Close(context.Background())
	return opsError(fn(ctx, conn), databaseURL)
}

func connect(ctx context.Context, databaseURL string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, usagef("DATABASE_URL: %w", err)
	}
	cfg.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, connectTimeoutDefault)
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "wlproj-cli"
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return conn, nil
}

func opsError(err error, databaseURL string) error {
	if err == nil {
		return nil
	}
	code := exitFailure
	var usage usageError
	var refused *replay.RefusedError
	switch {
	case errors.Is(err, replay.ErrAuditRequired), errors.Is(err, replay.ErrNoSelector), errors.As(err, &usage):
		code = exitUsage
	case errors.As(err, &refused):
		code = exitRefused
	}
	return &exitError{code: code, err: redactedError{msg: redact(err.Error(), databaseURL), err: err}}
}

// redactedError shows a scrubbed message but keeps the chain for errors.Is.
type redactedError struct {
	msg string
	err error
}

func (e redactedError) Error() string { return e.msg }
func (e redactedError) Unwrap() error { return e.err }

var userinfoPassword = regexp.MustCompile(`(://[^/@:]*:)[^/@]*@`)

// redact removes every form of the database password from msg: pgx redacts
// its own messages, but only on a best-effort basis, and the password may
// also come from PGPASSWORD or a password= parameter.
func redact(msg, databaseURL string) string {
	const mask = "xxxxx"
	var secrets []string
	if u, err := url.Parse(databaseURL); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			secrets = append(secrets, p, url.QueryEscape(p), url.PathEscape(p))
		}
	}
	if cfg, err := pgx.ParseConfig(databaseURL); err == nil && cfg.Password != "" {
		secrets = append(secrets, cfg.Password)
	}
	if databaseURL != "" {
		secrets = append(secrets, databaseURL)
	}
	// Longest first, so the whole URL goes before the password inside it.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, mask)
		}
	}
	return userinfoPassword.ReplaceAllString(msg, "${1}"+mask+"@")
}

// parseTime reads a --since/--until value: RFC3339, a date (UTC midnight),
// or a duration (Go syntax, or whole days like 7d) meaning that long before now.
func parseTime(flag, v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	if days, ok := strings.CutSuffix(v, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 {
			return now.Add(-time.Duration(n) * 24 * time.Hour), nil
		}
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, usagef("%s: %q is neither an RFC3339 time (2006-01-02T15:04:05Z), a date, nor a duration like 24h or 7d", flag, v)
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func formatAge(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// snippet is the first line of s, cut to n runes.
func snippet(s string, n int) string {
	s, _, cut := strings.Cut(strings.TrimSpace(s), "\n")
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n])
		cut = true
	}
	if cut {
		s += "…"
	}
	if s == "" {
		return "-"
	}
	return s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
