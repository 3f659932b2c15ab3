// Command testsummary prints, after make test, the suite at a glance from
// the go test -json files gotestsum wrote (one per engine run): each run's
// tests passed, failed and skipped with its packages' summed time, the
// failed tests by name, and the slowest packages and tests over all runs.
//
//	go run ./tools/testsummary [-top 20] .cache/test/*.json
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
}

// timing is one package's or test's time in one run.
type timing struct {
	run, name string
	seconds   float64
}

// runSummary is one file's tally.
type runSummary struct {
	name                 string
	passed, failed, skip int
	packageSeconds       float64
	failures             []string
	packages, tests      []timing
}

func main() {
	top := flag.Int("top", 20, "how many of the slowest packages and tests to list")
	flag.Parse()
	if err := run(os.Stdout, *top, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, top int, files []string) error {
	if len(files) == 0 {
		return fmt.Errorf("name the go test -json files, e.g. .cache/test/*.json")
	}
	var runs []runSummary
	for _, f := range files {
		s, err := summarize(f)
		if err != nil {
			return err
		}
		runs = append(runs, s)
	}
	printSummary(w, runs, top)
	return nil
}

// summarize reads one go test -json file.
func summarize(file string) (runSummary, error) {
	f, err := os.Open(file)
	if err != nil {
		return runSummary{}, err
	}
	defer f.Close()
	s := runSummary{name: strings.TrimSuffix(filepath.Base(file), ".json")}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // a build error's plain text
		}
		s.add(e)
	}
	return s, sc.Err()
}

func (s *runSummary) add(e event) {
	if e.Action != "pass" && e.Action != "fail" && e.Action != "skip" {
		return
	}
	pkg := strings.TrimPrefix(e.Package, "github.com/wlproj/wlproj/")
	if e.Test == "" {
		s.packageSeconds += e.Elapsed
		s.packages = append(s.packages, timing{s.name, pkg, e.Elapsed})
		if e.Action == "fail" {
			s.failures = append(s.failures, pkg+" (the package)")
		}
		return
	}
	if strings.Contains(e.Test, "/") {
		return // subtests are counted in their test's time
	}
	switch e.Action {
	case "pass":
		s.passed++
	case "fail":
		s.failed++
		s.failures = append(s.failures, pkg+" "+e.Test)
	case "skip":
		s.skip++
	}
	s.tests = append(s.tests, timing{s.name, pkg + " " + e.Test, e.Elapsed})
}

func printSummary(w io.Writer, runs []runSummary, top int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "run\ttop-level tests passed\tfailed\tskipped\tpackages' seconds (summed)")
	var packages, tests []timing
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\n", r.name, r.passed, r.failed, r.skip, r.packageSeconds)
		packages, tests = append(packages, r.packages...), append(tests, r.tests...)
	}
	tw.Flush()
	for _, r := range runs {
		for _, f := range r.failures {
			fmt.Fprintf(w, "FAILED on %s: %s\n", r.name, f)
		}
	}
	slowest(w, "packages", packages, top)
	slowest(w, "tests", tests, top)
}

func slowest(w io.Writer, what string, all []timing, top int) {
	sort.SliceStable(all, func(i, j int) bool { return all[i].seconds > all[j].seconds })
	fmt.Fprintf(w, "\nslowest %s:\n", what)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, t := range all[:min(top, len(all))] {
		fmt.Fprintf(tw, "  %6.1fs\t%s\t%s\n", t.seconds, t.run, t.name)
	}
	tw.Flush()
}
