package main

import (
	"errors"
	"log/slog"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/agent"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// cleanupTable is --cleanup: delete the agent's table and exit, refused
// while a running agent owns it.
func cleanupTable(k *kernel.Netlink, log *slog.Logger) int {
	// Say which happened: read first (Delete does nothing without a table).
	if t, _, err := k.Read(); err == nil && t == nil {
		log.Info("there is no table inet " + nft.TableName + ": nothing to delete")
		return 0
	}
	if err := k.Delete(); err != nil {
		if errors.Is(err, nft.ErrOwnedByOther) {
			log.Error("cleanup refused: a running agent owns the table and would put it back; delete its DaemonSet (or stop it) first", "err", err)
		} else {
			log.Error("cleanup failed", "err", agent.Hint(err))
		}
		return 1
	}
	log.Info("deleted table inet " + nft.TableName)
	return 0
}
