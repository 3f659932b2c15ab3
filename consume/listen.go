package consume

import (
	"context"
	"errors"
	"sync"
	"time"

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
// nobody, so the loop claims once more. Polling covers the gaps while it
// reconnects.
func (l *Loop) listen(ctx context.Context, state *listening, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := func() error {
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
					stmt := "UNLISTEN "
					if want {
						stmt = "LISTEN "
						if l.beforeListen != nil {
							l.beforeListen()
						}
					}
					if _, err := conn.Exec(ctx, stmt+outbox.NotifyChannel); err != nil {
						return err
					}
					on = want
					if on {
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
				// The wait ends with a NOTIFY, the term, or a change of
				// want; pgx ends it by a read deadline, which leaves the
				// connection usable.
				waitCtx, stop := context.WithCancel(ctx)
				go func() {
					select {
					case <-changed:
						stop()
					case <-waitCtx.Done():
					}
				}()
				_, err := conn.Conn().WaitForNotification(waitCtx)
				stop()
				switch {
				case err == nil:
					l.signal(wake)
				case ctx.Err() != nil:
					return ctx.Err()
				case errors.Is(err, context.Canceled) || waitCtx.Err() != nil:
					// want changed: loop round
				default:
					return err
				}
			}
		}()
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
