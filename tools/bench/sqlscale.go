package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// SQLScale is step 14: every statement the leader runs per batch or on a
// schedule, and the metrics poller's, EXPLAIN ANALYZEd next to ScaleRows
// done rows by outbox's TestStatementsAtScaleReadNoTableWhole, which fails
// on a sequential scan of the outbox or the ledger. One list of
// statements, kept beside them in outbox/scale_test.go, run here at the
// bench's size.
type SQLScale struct {
	Rows int `json:"rows"`
	// NoTableScan is whether the test passed: no statement reads
	// outbox_events or outbox_ledger whole, none is JIT-compiled.
	NoTableScan bool             `json:"no_table_scan"`
	Statements  []ScaleStatement `json:"statements"`
	Output      string           `json:"output,omitempty"`
}

type ScaleStatement struct {
	Name    string  `json:"name"`
	Ms      float64 `json:"ms"`
	Buffers int     `json:"buffers"`
}

// sqlScaleGoalMs is the bound on each statement's execution.
const sqlScaleGoalMs = 50

var scaleLine = regexp.MustCompile(`scale: (\S+) ([0-9.]+) ms (\d+) buffers`)

// 14. The scheduled and per-batch statements next to a long history.
func (b *bench) sqlScale(ctx context.Context) error {
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-timeout=60m", "-v",
		"-run", "^TestStatementsAtScaleReadNoTableWhole$", "./outbox")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "WLPROJ_SCALE_ROWS="+strconv.Itoa(b.cfg.ScaleRows))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	b.say("sql at scale: %d done rows (go test ./outbox)", b.cfg.ScaleRows)
	runErr := cmd.Run()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	res := &SQLScale{Rows: b.cfg.ScaleRows, NoTableScan: runErr == nil, Statements: scaleStatements(out.Bytes())}
	for _, st := range res.Statements {
		b.say("sql at scale: %s %.2f ms, %d buffers", st.Name, st.Ms, st.Buffers)
	}
	if runErr != nil {
		res.Output = tail(out.String(), 4000)
		b.say("sql at scale: FAILED: %v\n%s", runErr, res.Output)
	}
	if len(res.Statements) == 0 && runErr == nil {
		return fmt.Errorf("sql at scale: the test printed no statement")
	}
	b.rep.SQLScale = res
	return nil
}

// scaleStatements reads the scale test's "scale: <name> <ms> ms <buffers>
// buffers" lines.
func scaleStatements(out []byte) []ScaleStatement {
	var sts []ScaleStatement
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := scaleLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		ms, _ := strconv.ParseFloat(m[2], 64)
		buffers, _ := strconv.Atoi(m[3])
		sts = append(sts, ScaleStatement{Name: m[1], Ms: ms, Buffers: buffers})
	}
	return sts
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

func sqlScaleTargets(r *Report, add addTarget) {
	s := r.SQLScale
	if s == nil {
		return
	}
	add(fmt.Sprintf("statements at %d done rows: no sequential scan of the outbox or ledger", s.Rows), "0 scans",
		boolValue(s.NoTableScan), "passed", s.NoTableScan)
	for _, st := range s.Statements {
		add(fmt.Sprintf("statement at %d done rows: %s", s.Rows, st.Name), "<= 50", st.Ms, "ms", st.Ms <= sqlScaleGoalMs)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
