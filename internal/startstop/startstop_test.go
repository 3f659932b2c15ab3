package startstop

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// Stop cancels the run and returns once it has returned; a second Stop, or
// one before any Run, does nothing.
func TestRunnerStopWaitsForTheRun(t *testing.T) {
	t.Parallel()
	var r Runner
	r.Stop()
	require.False(t, r.Running())
	started, returned := make(chan struct{}), make(chan struct{})
	r.Run(context.Background(), func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		close(returned)
	})
	<-started
	require.True(t, r.Running())
	r.Stop()
	select {
	case <-returned:
	default:
		t.Fatal("Stop returned before the run did")
	}
	require.False(t, r.Running())
	r.Stop()
}

type fake struct {
	name string
	err  error
	log  *[]string
}

func (f fake) Start(context.Context) error {
	*f.log = append(*f.log, "start "+f.name)
	return f.err
}

func (f fake) Stop() { *f.log = append(*f.log, "stop "+f.name) }

// StartAll starts in order; when one fails, those already started stop,
// last first. StopAll stops last first.
func TestStartAllStopsWhatStartedWhenOneFails(t *testing.T) {
	t.Parallel()
	var log []string
	err := StartAll(context.Background(), fake{"a", nil, &log}, fake{"b", nil, &log}, fake{"c", errors.New("port taken"), &log})
	require.EqualError(t, err, "port taken")
	require.Equal(t, []string{"start a", "start b", "start c", "stop b", "stop a"}, log)

	log = nil
	services := []Service{fake{"a", nil, &log}, fake{"b", nil, &log}}
	require.NoError(t, StartAll(context.Background(), services...))
	StopAll(services...)
	require.Equal(t, []string{"start a", "start b", "stop b", "stop a"}, log)
}
