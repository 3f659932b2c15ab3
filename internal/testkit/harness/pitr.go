package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A point-in-time restore of a PGPair's primary, as an operator does it
// with a base backup and archived WAL: the cluster keeps its system
// identifier, so the queue's positions stay its own.

// ArchiveWAL makes the primary archive every WAL segment into a directory
// of the pair's (archive_mode needs the restart it does) and returns it.
func (p *PGPair) ArchiveWAL(t testing.TB) string {
	t.Helper()
	archive := filepath.Join(p.dir, "wal-archive")
	require.NoError(t, os.Mkdir(archive, 0o700))
	if p.cred != nil {
		require.NoError(t, os.Chown(archive, int(p.cred.Uid), int(p.cred.Gid)))
	}
	require.NoError(t, adminExec(context.Background(), p.nodeURL(p.Primary),
		`ALTER SYSTEM SET archive_mode = 'on'`,
		fmt.Sprintf(`ALTER SYSTEM SET archive_command = 'test ! -f %[1]s/%%f && cp %%p %[1]s/%%f'`, archive)))
	// -l: without it the server would keep pg_ctl's output open, and run
	// would wait for it.
	p.run(t, "pg_ctl", "-D", p.Primary.Data, "-l", filepath.Join(p.dir, "primary-archiving.log"), "-w", "-t", "30", "-m", "fast", "restart")
	return archive
}

// BaseBackup copies the running primary with pg_basebackup (its WAL
// streamed alongside) into a directory of the pair's and returns it.
func (p *PGPair) BaseBackup(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(p.dir, UniqueName("base_"))
	p.run(t, "pg_basebackup", "--pgdata", dir, "--dbname", p.nodeURL(p.Primary), "--wal-method=stream", "--checkpoint=fast")
	return dir
}

// RestorePoint names the primary's current point in its WAL, to recover to.
func (p *PGPair) RestorePoint(t testing.TB, name string) {
	t.Helper()
	require.NoError(t, adminExec(context.Background(), p.nodeURL(p.Primary),
		fmt.Sprintf(`SELECT pg_create_restore_point('%s')`, name)))
}

// RecoverTo replaces the primary by base recovered from the archive up to
// the restore point target, then promoted: every commit after it is gone.
// The primary's clients must be gone first: it is stopped.
func (p *PGPair) RecoverTo(t testing.TB, base, archive, target string) {
	t.Helper()
	ctx := context.Background()
	// The segment holding the restore point and the writes after it must
	// reach the archive before the primary stops.
	var segment string
	require.NoError(t, queryOnce(ctx, p.nodeURL(p.Primary), `SELECT pg_walfile_name(pg_switch_wal())`, &segment))
	require.NoError(t, Poll(ctx, 30*time.Second, "segment "+segment+" archived", func(context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(archive, segment))
		return err == nil, nil
	}))
	p.run(t, "pg_ctl", "-D", p.Primary.Data, "-w", "-t", "30", "-m", "fast", "stop")
	require.NoError(t, os.Rename(p.Primary.Data, p.Primary.Data+UniqueName(".before-pitr-")))
	require.NoError(t, os.Rename(base, p.Primary.Data))
	settings := fmt.Sprintf("restore_command = 'cp %s/%%f %%p'\nrecovery_target_name = '%s'\nrecovery_target_action = 'promote'\n",
		archive, target)
	conf, err := os.OpenFile(filepath.Join(p.Primary.Data, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = conf.WriteString(settings)
	require.NoError(t, err)
	require.NoError(t, conf.Close())
	signal := filepath.Join(p.Primary.Data, "recovery.signal")
	require.NoError(t, os.WriteFile(signal, nil, 0o600))
	if p.cred != nil {
		require.NoError(t, os.Chown(signal, int(p.cred.Uid), int(p.cred.Gid)))
	}
	p.start(t, p.Primary, "", "primary-pitr")
	require.NoError(t, Poll(ctx, 60*time.Second, "the recovered primary promoted", func(ctx context.Context) (bool, error) {
		in, err := p.InRecovery(ctx, p.Primary)
		return err == nil && !in, nil
	}))
}
