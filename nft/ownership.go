package nft

import (
	"errors"
	"fmt"
	"log/slog"
	"syscall"
)

// RefusesOwnership reports whether err, the kernel's refusal of op, means
// that the kernel cannot own the table: op is the creation of an owned
// (and persistent) table. Before Linux 6.9 a table cannot be owned and
// persist (without persist the table would vanish whenever the agent
// restarts), and kernels say so differently: 6.1 to 6.8 answer EOPNOTSUPP
// for the persist flag, 5.10 EINVAL for any flag but dormant (the owner
// flag came in 5.12). So the refusal of that message, whatever the errno,
// means "cannot own"; but a missing answer (nothing was refused) and
// EEXIST (an exclusive create found a table made since the read) do not.
func RefusesOwnership(op Op, err error) bool {
	return err != nil && op.Kind == KindTable && op.Verb == Add && op.Owned &&
		!errors.Is(err, ErrNoAnswer) && !errors.Is(err, syscall.EEXIST)
}

// CannotOwn is Send's error when the kernel refused ownership: ErrStale,
// so that Ensure plans again, now without ownership. It is logged once
// (the Kernel stops asking for ownership).
func CannotOwn(err error) error {
	slog.Info("the kernel cannot own a persistent table (Linux 6.9 or later); the table is verified and repaired instead", "refused", err.Error())
	return fmt.Errorf("%w: the kernel cannot own a persistent table (Linux 6.9 or later): %w", ErrStale, err)
}
