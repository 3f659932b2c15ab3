package cli

import (
	"context"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/wlproj/wlproj/internal/tracing"
	"github.com/wlproj/wlproj/policy"
)

// flushTimeout bounds the export of the last spans when a command ends.
const flushTimeout = 5 * time.Second

var tracer = otel.Tracer("github.com/wlproj/wlproj/cli")

// stateChanger is a command that changes the outbox, the index or the
// schema when it runs: it gets a span of its own when tracing is on.
type stateChanger interface{ changesState() bool }

func (*migrateCmd) changesState() bool       { return true }
func (*replayCmd) changesState() bool        { return true }
func (*failedDiscardCmd) changesState() bool { return true }
func (*failedArchiveCmd) changesState() bool { return true }
func (*rebuildCmd) changesState() bool       { return true }
func (*pauseCmd) changesState() bool         { return true }
func (*resumeCmd) changesState() bool        { return true }
func (c *verifyCmd) changesState() bool      { return c.Repair }

// runTraced runs the selected command; one that changes state runs inside
// a span named for it, `wlproj failed discard`, with its outcome, when the
// OTEL_* variables turn tracing on (package tracing; off unless they do).
// wlproj run starts tracing itself, after its first log line.
func runTraced(kctx *kong.Context, g *globals) error {
	actor := policy.CLI("")
	g.ctx = policy.With(context.Background(), actor)
	g.logger = g.logger.With().Str("request_id", actor.RequestID).Logger()
	sc, _ := kctx.Selected().Target.Addr().Interface().(stateChanger)
	if sc == nil || !sc.changesState() {
		return kctx.Run(g)
	}
	stop, err := startTracing(g.logger)
	if err != nil {
		return err
	}
	defer stop()
	name := commandName(kctx)
	var span trace.Span
	g.ctx, span = tracer.Start(g.ctx, "wlproj "+name, trace.WithAttributes(attribute.String("wlproj.command", name),
		attribute.String("wlproj.request_id", actor.RequestID), attribute.String("wlproj.os_user", actor.OSUser)))
	defer span.End()
	err = kctx.Run(g)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// startTracing starts tracing as the environment says and returns what
// flushes the last spans and stops it.
func startTracing(log zerolog.Logger) (stop func(), err error) {
	s, shutdown, err := tracing.Start(context.Background())
	if err != nil {
		return nil, err
	}
	if s.On {
		// The SDK's own errors (an export that failed) as JSON log lines,
		// not its default stderr logger's plain text.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn().Err(err).Msg("tracing") }))
		log.Info().Str("protocol", s.Protocol).Msg("tracing on")
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			log.Warn().Err(err).Msg("tracing: the last spans were not exported")
		}
	}, nil
}

// commandName is the command's path without its positional arguments.
func commandName(kctx *kong.Context) string {
	var words []string
	for w := range strings.FieldsSeq(kctx.Command()) {
		if !strings.HasPrefix(w, "<") {
			words = append(words, w)
		}
	}
	return strings.Join(words, " ")
}
