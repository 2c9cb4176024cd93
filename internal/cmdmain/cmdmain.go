// Package cmdmain is the shared main of Canopy's long-running binaries:
// parse flags, log JSON to stderr at the configured level, run until
// SIGINT or SIGTERM, and exit with a conventional status.
package cmdmain

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Run parses os.Args with parse and calls run with a context cancelled
// on SIGINT or SIGTERM. It exits 0 for -help, 2 for bad flags and 1 when
// run fails.
func Run[C any](name string, parse func([]string) (C, error), level func(C) slog.Level, run func(context.Context, C, *slog.Logger) error) {
	cfg, err := parse(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level(cfg)}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, cfg, log)
	stop()
	if err != nil {
		log.Error(name+" failed", "err", err)
		os.Exit(1)
	}
}
