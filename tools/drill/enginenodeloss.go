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

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// nodeOutageDefault is how long each node stays silent, answering 503,
// or killed: past the client's longest probe interval (30 s), so that its
// probes of the node are seen failing at their slowest too.
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
	// Faults are the phases in which one node's proxy was silent, then
	// another's answered 503, in order.
	Faults []*NodeFault `json:"faults"`
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
	// BulksToKilledNode are the bulks its proxy received while the node
	// was down (each answered 502).
	BulksToKilledNode int `json:"bulks_to_node_while_down"`
	// Killed is what the outbox says of the kill phase. The drill used to
	// count the events with a connection error since the kill
	// (events_with_connection_errors), the dead node's bulks retried as
	// attempts. The client now sends a lost node's requests to another
	// node itself, and the proxy in front of the dead node answers 502,
	// which it resends too: no event may have any error since the kill.
	Killed PhaseEvents `json:"kill_events"`
}

func (n *NodeLoss) notes() string {
	var faults []string
	for _, f := range n.Faults {
		faults = append(faults, f.notes())
	}
	master := ""
	if n.WasMaster {
		master = " (the master)"
	}
	kill := fmt.Sprintf("killed %s%s; primary moved in %.1f s; first ack %.2f s after the kill; reads %d ok, %d failed; "+
		"down %.0f s, %d bulks to it, green %.1f s after restart; %s",
		n.KilledNode, master, n.PrimaryMovedSeconds, n.FirstAckSeconds, n.ReadsOK, n.ReadsFailed,
		n.DownSeconds, n.BulksToKilledNode, n.GreenSeconds, n.Killed.notes())
	return strings.Join(append(faults, kill), "; ")
}

// verdict lists every promise engine-node-loss broke, phase by phase.
func (n *NodeLoss) verdict() error {
	var errs []error
	for _, f := range n.Faults {
		errs = append(errs, f.verdict())
	}
	return errors.Join(append(errs, n.killVerdict())...)
}

// killVerdict is the kill phase's: reads through the other nodes answered
// all along, the dead node left the rotation, and no event used an
// attempt or failed.
func (n *NodeLoss) killVerdict() error {
	errs := n.Killed.errorsVerdict()
	if n.ReadsOK == 0 {
		errs = append(errs, errors.New("no read of the index answered while the node was down"))
	}
	if n.ReadsFailed > 0 {
		errs = append(errs, fmt.Errorf("%d of %d reads through the remaining nodes failed while the node was down", n.ReadsFailed, n.ReadsFailed+n.ReadsOK))
	}
	if n.BulksToKilledNode > nodeFaultBulkLimit {
		errs = append(errs, fmt.Errorf("the killed node got %d bulks while down (limit %d): it stayed in the rotation", n.BulksToKilledNode, nodeFaultBulkLimit))
	}
	return phaseErr(n.KilledNode+" killed", errs)
}

// engineNodeLoss: a fault proxy stands in front of each engine node, and
// the replicas move to the proxies' node list (a rolling restart, as an
// operator would roll a new setting out); the index gets a replica. Under
// load, one node's proxy stops answering (a lost host) for -node-outage,
// then another's answers 503 (a node cut off from its master): each time
// the node must leave the rotation after at most nodeFaultBulkLimit bulks
// and come back once its proxy forwards again, and no event may wait more
// than nodeFaultLagLimit, use an attempt or fail. Then the node holding
// the primary is killed -9: reads of the index through the other nodes
// must keep answering and the leader keep acking, without an attempt
// used. Last, every event and document is checked against the model. The
// drill's own reads and questions to the cluster go to the nodes, not
// through the proxies.
func (d *drill) engineNodeLoss(ctx context.Context, sc *Scenario) error {
	nc := d.cfg.Nodes
	if err := nc.check(); err != nil {
		return err
	}
	if len(d.nodeProxies) != len(nc.URLs) {
		return fmt.Errorf("%d fault proxies for %d nodes", len(d.nodeProxies), len(nc.URLs))
	}
	nl := &NodeLoss{}
	sc.NodeLoss = nl
	if err := d.onNodeList(ctx, sc); err != nil {
		return err
	}
	for _, phase := range []struct {
		node  int
		kind  string
		fault faultproxy.Fault
	}{
		// The first node is olivere's own URL too.
		{0, "silent", faultproxy.Fault{Delay: time.Hour}},
		{1, "503", faultproxy.Fault{Status: http.StatusServiceUnavailable}},
	} {
		f, err := d.nodeFault(ctx, sc, phase.node, phase.kind, phase.fault)
		nl.Faults = append(nl.Faults, f)
		if err != nil {
			return err
		}
	}
	if err := d.killPrimaryNode(ctx, sc, nl); err != nil {
		return err
	}
	d.prod.pause()
	defer d.prod.resume()
	return errors.Join(nl.verdict(), d.checkModel(ctx))
}

// onNodeList gives the index a replica, waits for it, and rolls the
// replicas onto the nodes' proxies.
func (d *drill) onNodeList(ctx context.Context, sc *Scenario) error {
	if err := harness.ES(ctx, d.cfg.ElasticURL, http.MethodPut, "/"+d.s.Index+"/_settings",
		[]byte(`{"index":{"number_of_replicas":1}}`), nil); err != nil {
		return err
	}
	if err := d.waitGreen(ctx, d.cfg.ElasticURL); err != nil {
		return err
	}
	if err := d.rollOntoNodeList(ctx); err != nil {
		return err
	}
	before, err := d.backlog(ctx)
	sc.BacklogBefore, sc.BacklogPeak = ptr(before), ptr(before)
	return err
}

// killPrimaryNode kills -9 the node holding the index's primary under
// load, keeps it down for -node-outage while reading through the other
// nodes, starts it again and waits for the index to be green and the
// backlog written meanwhile to be done.
func (d *drill) killPrimaryNode(ctx context.Context, sc *Scenario, nl *NodeLoss) error {
	nc := d.cfg.Nodes
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
	// Whatever happens next, the node is started again.
	defer func() {
		if !nc.alive(victim) {
			if err := nc.start(d.s.Root, victim); err != nil {
				d.say("engine-node-loss: could not start %s again: %v", primary, err)
			}
		}
	}()
	mark, err := d.markLag()
	if err != nil {
		return err
	}
	t0, err := d.nodeDown(ctx, sc, nl, victim)
	if err != nil {
		return err
	}
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
	nl.Killed, err = d.phaseEventsSince(ctx, t0, mark)
	return err
}

// nodeDown kills node victim, which holds the primary, and keeps it down
// for -node-outage, reading through the other nodes; it returns when it
// killed it, on Postgres' clock.
func (d *drill) nodeDown(ctx context.Context, sc *Scenario, nl *NodeLoss, victim int) (time.Time, error) {
	nc := d.cfg.Nodes
	rest := slices.Delete(slices.Clone(nc.URLs), victim, victim+1)
	restList := strings.Join(rest, ",")
	reads := startReader(ctx, rest, d.s.Index)
	defer func() { nl.ReadsOK, nl.ReadsFailed = reads.stop() }()
	t0, err := harness.Now(ctx, d.s.DB.Pool)
	if err != nil {
		return t0, err
	}
	killed := time.Now()
	if err := nc.kill(victim); err != nil {
		return t0, fmt.Errorf("kill -9 %s: %w", nl.KilledNode, err)
	}
	d.say("engine-node-loss: killed %s (primary of %s, master: %t) with kill -9; reading through %s", nl.KilledNode, d.s.Index, nl.WasMaster, restList)
	err = harness.PollAt(ctx, 100*time.Millisecond, stepTimeout, "the primary on another node", func(ctx context.Context) (bool, error) {
		p, _, err := d.primaryNode(ctx, restList)
		return err == nil && p != "" && p != nl.KilledNode, nil
	})
	if err != nil {
		return t0, err
	}
	nl.PrimaryMovedSeconds = harness.Elapsed(killed)
	ack, err := harness.WaitFirstAck(ctx, stepTimeout, d.s.DB.Pool, t0, "")
	if err != nil {
		return t0, fmt.Errorf("no ack after the kill: %w", err)
	}
	nl.FirstAckSeconds = harness.Round3(ack.Sub(t0).Seconds())
	d.say("engine-node-loss: primary moved %.1f s after the kill; first ack %.2f s after it", nl.PrimaryMovedSeconds, nl.FirstAckSeconds)
	err = d.sampleUntil(ctx, sc, killed.Add(d.cfg.NodeOutage))
	nl.BulksToKilledNode, _ = bulksSince(d.nodeProxies[victim], killed)
	nl.DownSeconds = harness.Elapsed(killed)
	return t0, err
}

// rollOntoNodeList restarts the replicas, standby first, with ELASTIC_URL
// the nodes' fault proxies (nodeListURL) instead of their path through the
// hold proxies to the first node's fault proxy.
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
	d.say("engine-node-loss: replicas restarted with ELASTIC_URL=%s, a fault proxy in front of each of %s", d.nodeListURL(), d.cfg.ElasticURL)
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
