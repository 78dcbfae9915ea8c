package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
)

// stagedSweeper is the Redis transport's side of `celeriac staged`.
type stagedSweeper interface {
	SweepStaged(ctx context.Context) (int, error)
	StagedLen(ctx context.Context) (int64, error)
}

func newStagedCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "staged",
		Short: "Put back what dead workers left in the Redis staged pop's lists",
		Long: `The staged Redis pop (broker_transport_options {"celeriac_staged_pop": true})
moves each message into a staging list of its worker's own before recording
it in kombu's unacked hash. A worker killed between those two steps leaves
that round's messages in its staging lists, and only celeriac puts them back:
every staged worker does, 60 s after the dead one's last heartbeat. Python
workers know only kombu's unacked, so a fleet that goes back to Python alone
runs this once, after its last celeriac worker has stopped.`,
	}
	sweep := &cobra.Command{
		Use:   "sweep",
		Short: "Put back, in order, the staged messages of every worker whose heartbeat stopped 60 s ago or more",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			s, ok := conn.Transport.(stagedSweeper)
			if !ok {
				return fmt.Errorf("the %s transport has no staged pop (Redis only)", conn.BrokerScheme)
			}
			n, err := s.SweepStaged(cmd.Context())
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "put back %s of stopped workers\n", plural(n, "staged message"))
			if err != nil {
				return err
			}
			left, err := s.StagedLen(cmd.Context())
			if err != nil {
				return err
			}
			if left > 0 {
				fmt.Fprintf(out, "%s still staged by workers that beat within the last 60 s: run again once they have stopped\n", plural(int(left), "message"))
			}
			return nil
		},
	}
	cmd.AddCommand(sweep)
	return cmd
}
