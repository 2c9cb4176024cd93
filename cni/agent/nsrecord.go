package agent

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
)

// keepNamespaceRecord keeps the namespace record (pluginevent) the plugin
// reads when it cannot reach the agent: rewritten, in one rename, whenever
// the namespaces outside the mesh change, until ctx ends. The agent's
// informers must have synced.
func (a *Agent) keepNamespaceRecord(ctx context.Context) {
	path := a.cfg.NamespaceRecord
	var last []string
	written := false
	for {
		nss, nerr := a.namespaces.List(labels.Everything())
		pods, perr := a.pods.List(labels.Everything())
		if err := errors.Join(nerr, perr); err != nil {
			a.log.Warn("cannot list namespaces and pods for the namespace record", "err", err)
		} else if outside := enroll.OutsideMesh(nss, pods, a.cfg.Enroll); !written || !slices.Equal(last, outside) {
			err := os.MkdirAll(filepath.Dir(path), 0o755)
			if err == nil {
				err = pluginevent.WriteNamespaceRecord(path, pluginevent.NamespaceRecord{OutsideMesh: outside})
			}
			if err != nil {
				a.log.Warn("cannot write the namespace record", "path", path, "err", err)
			} else {
				last, written = outside, true
				a.log.Debug("namespace record written", "path", path, "outside_mesh", len(outside))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-a.recordWake:
		case <-time.After(a.cfg.ReconcilePeriod): // retry a failed write
		}
	}
}

// removeNamespaceRecord deletes the record (uninstall): without it the
// plugin fails closed for every pod.
func (a *Agent) removeNamespaceRecord() error {
	if a.cfg.NamespaceRecord == "" {
		return nil
	}
	if err := os.Remove(a.cfg.NamespaceRecord); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
