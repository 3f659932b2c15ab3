package rebuild

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/mask"
)

// A source row whose masked field holds a value the new index refuses (a
// string into a long) is reported refused with the value masked in its
// message: the engine's error quotes it.
func TestRebuildMasksRefusedMessages(t *testing.T) {
	t.Parallel()
	const marker = "MARKER-5e0b-not-a-count"
	b := setupLed(t, 20)
	b.db.Exec(t, `INSERT INTO search_index VALUES ('book', 'bad', jsonb_build_object('kind', 'book', 'word_count', $1::text), 1)`, marker)
	cfg := b.config(t)
	cfg.AllowRefused = true
	var err error
	cfg.Mask, err = mask.Compile([]string{"word_count"})
	require.NoError(t, err)
	var refused []Refused
	cfg.OnRefused = func(r Refused) { refused = append(refused, r) }
	rep, err := Run(b.ctx, cfg)
	require.NoError(t, err)
	require.Len(t, refused, 1)
	require.Equal(t, "bad", refused[0].EntityID)
	require.Contains(t, refused[0].Message, "word_count", "the engine's text is kept")
	require.Contains(t, refused[0].Message, mask.Marker)
	for _, r := range append(refused, rep.RefusedRows...) {
		require.NotContains(t, r.Message, "5e0b")
	}
}
