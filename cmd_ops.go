package main

type replayCmd struct{}

func (c *replayCmd) Run(g *globals) error { return errNotImplemented }

type failedCmd struct {
	List  failedListCmd  `cmd:"" help:"List failed events."`
	Stats failedStatsCmd `cmd:"" help:"Count failed events by projection and reason."`
}

type failedListCmd struct{}

func (c *failedListCmd) Run(g *globals) error { return errNotImplemented }

type failedStatsCmd struct{}

func (c *failedStatsCmd) Run(g *globals) error { return errNotImplemented }

type statusCmd struct{}

func (c *statusCmd) Run(g *globals) error { return errNotImplemented }
