package consume

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wlproj/wlproj/outbox"
)

// quietAfter is the claim size from which the loop stops listening: it then
// claims again after each cooldown anyway, and every insert's NOTIFY would
// cost the application's database a wake-up of the listening backend and a
// message for nothing. An empty claim turns listening back on. Below this
// size (a trickle, under ~200 events/s with the default cooldown) the loop
// keeps listening, so that LISTEN and UNLISTEN do not alternate.
const quietAfter = 10

// listening is whether the loop wants NOTIFYs, as the listener follows it.
type listening struct {
	mu      sync.Mutex
	want    bool
	changed chan struct{} // closed and replaced at each change of want
}

func newListening() *listening {
	return &listening{want: true, changed: make(chan struct{})}
}

// set asks for want; it returns at once, the listener follows.
func (s *listening) set(want bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.want != want {
		s.want = want
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

func (s *listening) get() (bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.want, s.changed
}

// listen turns NOTIFYs from the insert trigger into wake-ups while the loop
// wants them (l.listening), and sends one more wake-up each time it starts
// listening: a row inserted before LISTEN took effect sent its NOTIFY to
// nobody, so the loop claims once more. HeadChannel's NOTIFYs (a resume, a
// repair) ask the next claim to start from the head. Both channels are
// listened to only while the loop is idle: Postgres wakes every backend
// that listens in the database at each NOTIFY, whatever its channel, and a
// busy leader claims from the head every PollInterval anyway (a busy
// leader's listener that kept to HeadChannel alone was woken 2,000 times a
// second by the inserts' NOTIFYs). Polling covers the gaps while it
// reconnects.
func (l *Loop) listen(ctx context.Context, state *listening, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := l.listenOn(ctx, state, wake)
		if ctx.Err() != nil {
			return
		}
		l.log.Warn().Err(err).Msg("listen failed; relying on polling until it reconnects")
		select {
		case <-ctx.Done():
		case <-time.After(l.cfg.PollInterval):
		}
	}
}

// listenOn listens on one connection of the pool until an error or the end
// of the term.
func (l *Loop) listenOn(ctx context.Context, state *listening, wake chan<- struct{}) error {
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// A connection that was LISTENing must not go back to the pool.
	defer conn.Conn().Close(context.Background())
	on := false
	for {
		want, changed := state.get()
		if want != on {
			if err := l.setListening(ctx, conn.Conn(), want); err != nil {
				return err
			}
			on = want
			if on {
				// A head request sent while nothing listened reached nobody.
				l.headWanted.Store(true)
				l.signal(wake)
			}
			continue
		}
		if !on {
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		n, err := waitNotification(ctx, conn.Conn(), changed)
		switch {
		case err == nil:
			if n.Channel == outbox.HeadChannel {
				l.headWanted.Store(true)
			}
			l.signal(wake)
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.Canceled):
			// want changed: loop round
		default:
			return err
		}
	}
}

// setListening LISTENs to the insert trigger's channel and HeadChannel, or
// UNLISTENs both.
func (l *Loop) setListening(ctx context.Context, conn *pgx.Conn, want bool) error {
	stmt := "UNLISTEN "
	if want {
		stmt = "LISTEN "
		if l.beforeListen != nil {
			l.beforeListen()
		}
	}
	for _, channel := range []string{outbox.HeadChannel, outbox.NotifyChannel} {
		if _, err := conn.Exec(ctx, stmt+channel); err != nil {
			return err
		}
	}
	return nil
}

// waitNotification waits for a NOTIFY, the term, or a change of want
// (context.Canceled); pgx ends the wait by a read deadline, which leaves
// the connection usable.
func waitNotification(ctx context.Context, conn *pgx.Conn, changed <-chan struct{}) (*pgconn.Notification, error) {
	waitCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-changed:
			stop()
		case <-waitCtx.Done():
		}
	}()
	n, err := conn.WaitForNotification(waitCtx)
	if err != nil && ctx.Err() == nil && waitCtx.Err() != nil {
		return nil, context.Canceled
	}
	return n, err
}
