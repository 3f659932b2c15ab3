package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// nodeOutageDefault is how long the killed node stays down: past the
// client's longest revive delay (30 s), so the replicas' retries of the
// dead node are seen too.
const nodeOutageDefault = 40 * time.Second

// NodeControl kills and restarts the engine nodes of a multi-node stack
// (`ENGINE_NODES=3 scripts/stack.sh up`), from its env file's variables.
type NodeControl struct {
	// URLs are the nodes' base URLs, ELASTIC_URL's list.
	URLs []string
	// Names are the nodes' node.name, in the same order
	// (STACK_ENGINE_NODE_NAMES).
	Names []string
	// PIDFiles are the nodes' pid files (STACK_ENGINE_PID_FILES).
	PIDFiles []string
	// StackEnv is the stack's env file (WLPROJ_STACK_ENV), Engine its
	// engine (STACK_ENGINE): `scripts/stack.sh start-node` needs both.
	StackEnv, Engine string
}

// nodeControlFromEnv reads the stack's variables; a one-node stack gives
// one URL and no names.
func nodeControlFromEnv() NodeControl {
	split := func(s, sep string) []string {
		var out []string
		for f := range strings.SplitSeq(s, sep) {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
		return out
	}
	return NodeControl{URLs: split(os.Getenv("ELASTIC_URL"), ","), Names: split(os.Getenv("STACK_ENGINE_NODE_NAMES"), ","),
		PIDFiles: split(os.Getenv("STACK_ENGINE_PID_FILES"), " "), StackEnv: os.Getenv("WLPROJ_STACK_ENV"),
		Engine: os.Getenv("STACK_ENGINE")}
}

// check says why the scenario cannot run on this stack, if it cannot.
func (n NodeControl) check() error {
	if len(n.URLs) < 2 || len(n.Names) != len(n.URLs) || len(n.PIDFiles) != len(n.URLs) || n.StackEnv == "" {
		return errors.New("engine-node-loss needs a stack of several engine nodes (`make drill` starts three; " +
			"or ENGINE_NODES=3 scripts/stack.sh up); pass -node-loss=false to skip it")
	}
	return nil
}

func (n NodeControl) kill(i int) error {
	data, err := os.ReadFile(n.PIDFiles[i])
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return fmt.Errorf("%s: %w", n.PIDFiles[i], err)
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// alive says whether node i's process runs.
func (n NodeControl) alive(i int) bool {
	data, err := os.ReadFile(n.PIDFiles[i])
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	return err == nil && syscall.Kill(pid, 0) == nil
}

// start starts node i again, with its data directory, as the stack did.
func (n NodeControl) start(root string, i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "stack.sh"), "start-node", strconv.Itoa(i+1))
	cmd.Env = append(os.Environ(), "WLPROJ_STACK_ENV="+n.StackEnv, "ENGINE="+n.Engine)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("stack.sh start-node %d: %w: %s", i+1, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// NodeLoss is what engine-node-loss measured.
type NodeLoss struct {
	// KilledNode held the index's primary shard; WasMaster says whether it
	// was also the elected master.
	KilledNode string `json:"killed_node"`
	WasMaster  bool   `json:"was_master"`
	// PrimaryMovedSeconds is kill → the primary on another node.
	PrimaryMovedSeconds float64 `json:"primary_moved_seconds"`
	// FirstAckSeconds is kill → the first ack after it (Postgres' clock).
	FirstAckSeconds float64 `json:"first_ack_after_kill_seconds"`
	// Reads of the index through the remaining nodes while the node was
	// down: answered in full, and failed or partial.
	ReadsOK     int64 `json:"reads_ok"`
	ReadsFailed int64 `json:"reads_failed"`
	// DownSeconds is how long the node was down; GreenSeconds restart →
	// the index green again, its replica rebuilt on the returned node or
	// elsewhere.
	DownSeconds  float64 `json:"node_down_seconds"`
	GreenSeconds float64 `json:"green_after_restart_seconds"`
	// ConnectionErrors are events whose history holds a connection error
	// or timeout since the kill: bulks that went to the dead node and were
	// retried on another.
	ConnectionErrors int64 `json:"events_with_connection_errors"`
}

func (n *NodeLoss) notes() string {
	master := ""
	if n.WasMaster {
		master = " (the master)"
	}
	return fmt.Sprintf("killed %s%s; primary moved in %.1f s; first ack %.2f s after the kill; reads %d ok, %d failed; "+
		"down %.0f s, green %.1f s after restart; %d events retried after a connection error",
		n.KilledNode, master, n.PrimaryMovedSeconds, n.FirstAckSeconds, n.ReadsOK, n.ReadsFailed,
		n.DownSeconds, n.GreenSeconds, n.ConnectionErrors)
}

// engineNodeLoss: the replicas move to ELASTIC_URL's node list (a rolling
// restart, as an operator would roll a new setting out), the index gets a
// replica, and under load the node holding its primary is killed -9. Reads
// of the index through the other nodes must keep answering, the leader must
// keep acking, and once the node is back and the index green, every event
// must be done: nothing failed of a transient error.
func (d *drill) engineNodeLoss(ctx context.Context, sc *Scenario) error {
	nc := d.cfg.Nodes
	if err := nc.check(); err != nil {
		return err
	}
	nl := &NodeLoss{}
	sc.NodeLoss = nl
	index := d.s.Index
	if err := harness.ES(ctx, d.cfg.ElasticURL, http.MethodPut, "/"+index+"/_settings",
		[]byte(`{"index":{"number_of_replicas":1}}`), nil); err != nil {
		return err
	}
	if err := d.waitGreen(ctx, d.cfg.ElasticURL); err != nil {
		return err
	}
	if err := d.rollOntoNodeList(ctx); err != nil {
		return err
	}

	if _, _, _, err := d.settled(ctx); err != nil {
		return err
	}
	primary, master, err := d.primaryNode(ctx, d.cfg.ElasticURL)
	if err != nil {
		return err
	}
	victim := slices.Index(nc.Names, primary)
	if victim < 0 {
		return fmt.Errorf("the primary is on %q, not one of the stack's nodes %v", primary, nc.Names)
	}
	nl.KilledNode, nl.WasMaster = primary, primary == master
	rest := slices.Delete(slices.Clone(nc.URLs), victim, victim+1)
	restList := strings.Join(rest, ",")
	// Whatever happens next, the node is started again.
	defer func() {
		if !nc.alive(victim) {
			if err := nc.start(d.s.Root, victim); err != nil {
				d.say("engine-node-loss: could not start %s again: %v", primary, err)
			}
		}
	}()

	before, err := d.backlog(ctx)
	if err != nil {
		return err
	}
	sc.BacklogBefore, sc.BacklogPeak = ptr(before), ptr(before)
	reads := startReader(ctx, rest, index)
	t0, err := harness.Now(ctx, d.s.DB.Pool)
	if err != nil {
		reads.stop()
		return err
	}
	killed := time.Now()
	if err := nc.kill(victim); err != nil {
		reads.stop()
		return fmt.Errorf("kill -9 %s: %w", primary, err)
	}
	d.say("engine-node-loss: killed %s (primary of %s, master: %t) with kill -9; reading through %s", primary, index, nl.WasMaster, restList)

	err = harness.PollAt(ctx, 100*time.Millisecond, stepTimeout, "the primary on another node", func(ctx context.Context) (bool, error) {
		p, _, err := d.primaryNode(ctx, restList)
		return err == nil && p != "" && p != primary, nil
	})
	if err != nil {
		reads.stop()
		return err
	}
	nl.PrimaryMovedSeconds = harness.Elapsed(killed)
	ack, err := harness.WaitFirstAck(ctx, stepTimeout, d.s.DB.Pool, t0, "")
	if err != nil {
		reads.stop()
		return fmt.Errorf("no ack after the kill: %w", err)
	}
	nl.FirstAckSeconds = harness.Round3(ack.Sub(t0).Seconds())
	d.say("engine-node-loss: primary moved %.1f s after the kill; first ack %.2f s after it", nl.PrimaryMovedSeconds, nl.FirstAckSeconds)
	for end := killed.Add(d.cfg.NodeOutage); time.Now().Before(end); {
		if err := d.sampleBacklog(ctx, sc); err != nil {
			reads.stop()
			return err
		}
		if err := harness.Sleep(ctx, 250*time.Millisecond); err != nil {
			reads.stop()
			return err
		}
	}
	nl.ReadsOK, nl.ReadsFailed = reads.stop()
	nl.DownSeconds = harness.Elapsed(killed)

	restarted := time.Now()
	if err := nc.start(d.s.Root, victim); err != nil {
		return err
	}
	if err := d.waitGreen(ctx, d.cfg.ElasticURL); err != nil {
		return err
	}
	nl.GreenSeconds = harness.Elapsed(restarted)
	back, err := harness.Now(ctx, d.s.DB.Pool)
	if err != nil {
		return err
	}
	d.say("engine-node-loss: %s back; index green %.1f s after the restart; reads while down: %d ok, %d failed",
		primary, nl.GreenSeconds, nl.ReadsOK, nl.ReadsFailed)
	if err := d.catchUp(ctx, sc, back); err != nil {
		return err
	}
	var failed int64
	if err := d.s.DB.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE status = 'failed' AND error_class = 'transient'),
		       count(*) FILTER (WHERE EXISTS (SELECT FROM jsonb_array_elements(error_history) h
		                                       WHERE h->>'reason' IN ('connection', 'timeout') AND (h->>'at')::timestamptz >= $1))
		  FROM outbox_events`, t0).Scan(&failed, &nl.ConnectionErrors); err != nil {
		return err
	}
	switch {
	case failed > 0:
		return fmt.Errorf("%d events failed of a transient error: a node loss must fail nothing", failed)
	case nl.ReadsOK == 0:
		return errors.New("no read of the index answered while the node was down")
	case nl.ReadsFailed > 0:
		return fmt.Errorf("%d of %d reads through the remaining nodes failed while the node was down", nl.ReadsFailed, nl.ReadsFailed+nl.ReadsOK)
	}
	return nil
}

// rollOntoNodeList restarts the replicas, standby first, with ELASTIC_URL
// the stack's node list instead of their path through the proxies.
func (d *drill) rollOntoNodeList(ctx context.Context) error {
	d.nodeList = true
	l, _, err := d.waitLeader(ctx, 0)
	if err != nil {
		return err
	}
	scratch := &Scenario{}
	for _, s := range []*slot{d.other(l), l} {
		if err := d.sigterm(ctx, scratch, s, s == l); err != nil {
			return err
		}
		if err := d.startProc(ctx, s); err != nil {
			return err
		}
		if err := d.waitStandby(ctx, s); err != nil {
			return err
		}
	}
	d.say("engine-node-loss: replicas restarted with ELASTIC_URL=%s", d.cfg.ElasticURL)
	return nil
}

// waitGreen waits until the drill's index is green: every copy allocated.
func (d *drill) waitGreen(ctx context.Context, base string) error {
	return harness.PollAt(ctx, 500*time.Millisecond, 3*time.Minute, "index "+d.s.Index+" green", func(ctx context.Context) (bool, error) {
		var h struct {
			Status string `json:"status"`
		}
		err := harness.ES(ctx, base, http.MethodGet, "/_cluster/health/"+d.s.Index+"?wait_for_status=green&timeout=5s", nil, &h)
		return err == nil && h.Status == "green", nil
	})
}

// primaryNode is the node holding the index's started primary, and the
// elected master, as the nodes at base see them.
func (d *drill) primaryNode(ctx context.Context, base string) (primary, master string, err error) {
	var shards []struct {
		PriRep string `json:"prirep"`
		State  string `json:"state"`
		Node   string `json:"node"`
	}
	if err := harness.ES(ctx, base, http.MethodGet, "/_cat/shards/"+d.s.Index+"?format=json&h=prirep,state,node", nil, &shards); err != nil {
		return "", "", err
	}
	for _, s := range shards {
		if s.PriRep == "p" && s.State == "STARTED" {
			primary = s.Node
		}
	}
	var masters []struct {
		Node string `json:"node"`
	}
	if err := harness.ES(ctx, base, http.MethodGet, "/_cat/master?format=json&h=node", nil, &masters); err == nil && len(masters) == 1 {
		master = masters[0].Node
	}
	if primary == "" {
		return "", master, fmt.Errorf("no started primary of %s", d.s.Index)
	}
	return primary, master, nil
}

// reader searches the index through nodes, one after the other, every
// 100 ms, and counts the answers that covered every shard and the rest.
type reader struct {
	ok, failed atomic.Int64
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

func startReader(ctx context.Context, nodes []string, index string) *reader {
	r := &reader{}
	ctx, r.cancel = context.WithCancel(ctx)
	r.wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			var res struct {
				Shards struct {
					Total      int `json:"total"`
					Successful int `json:"successful"`
				} `json:"_shards"`
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := harness.ES(rctx, nodes[i%len(nodes)], http.MethodGet, "/"+index+"/_search?size=1", nil, &res)
			cancel()
			switch {
			case ctx.Err() != nil:
				return
			case err == nil && res.Shards.Total > 0 && res.Shards.Successful == res.Shards.Total:
				r.ok.Add(1)
			default:
				r.failed.Add(1)
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	return r
}

// stop ends the reads and returns their counts.
func (r *reader) stop() (ok, failed int64) {
	r.cancel()
	r.wg.Wait()
	return r.ok.Load(), r.failed.Load()
}
