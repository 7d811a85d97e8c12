package account

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// The operator name (spec §2.1: required per operator, given with the
// first handle, inherited by the later ones) lives in one place: the
// account of the address, Account.OperatorName. Every door that takes one
// (a registrar claim, `mesh-adapter join`, the console, minting an agent
// key, `meshd admin agent-token --operator`) writes it there through
// SetOperatorName, only when the account has none yet, so the first one
// given stays; everything that shows one (cards, the console, the answers)
// reads it there. A handle keeps a copy of the name it was claimed under,
// for the card of an address whose account has none.

// AccountOfEmail reads, in tx, the account of an address (normalised as
// NormalizeEmail does); nil when the address has none.
func AccountOfEmail(tx store.Tx, email string) (*Account, error) {
	var idx emailIndex
	if err := tx.Get(CollEmails, email, &idx); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	var a Account
	if err := tx.Get(CollAccounts, idx.AccountID, &a); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	return &a, nil
}

// SetOperatorName gives, in tx, the account of email the operator name
// name when it has none yet, and returns the name in force after: the
// account's own when it had one (the first name given stays), else name.
// acct is that account as read earlier in tx by AccountOfEmail (nil when
// the address has none); SetOperatorName only writes, so it comes after
// the transaction's reads. An address with no account gets one,
// unverified (proving the address to the registrar is not signing in; a
// sign-in with a mailed code verifies it), so that the name has its one
// home. An empty name writes nothing. name must have passed a
// CheckOperatorName.
func SetOperatorName(tx store.Tx, email string, acct *Account, name string, now time.Time) (string, error) {
	switch {
	case acct != nil && acct.OperatorName != "":
		return acct.OperatorName, nil
	case name == "":
		return "", nil
	case acct != nil:
		return name, tx.Update(CollAccounts, acct.ID, map[string]any{"operator_name": name})
	}
	a := newAccount(email, now)
	a.OperatorName = name
	return name, createIn(tx, a)
}

func newAccount(email string, now time.Time) Account {
	return Account{ID: "acct_" + strings.ReplaceAll(protocol.NewID(), "-", ""), Email: email, CreatedAt: ms(now)}
}

// createIn writes a new account and its address's index in tx (writes only).
func createIn(tx store.Tx, a Account) error {
	if err := tx.Create(CollEmails, a.Email, emailIndex{AccountID: a.ID}); err != nil {
		return err
	}
	return tx.Create(CollAccounts, a.ID, a)
}

// HandleNote is the sentence a new agent key's answer carries about the
// handle its label stands as a claim on (spec §4.4): which handle the
// agent will claim when it starts, or plainly why it will claim none. It
// says what the key exchange (credential.Service.Bootstrap) would do with
// acct and the handle's record h (nil when nobody holds the handle) as they
// are now; either may change before the agent starts.
func HandleNote(label string, acct Account, h *Handle) string {
	claim := HandleClaimOf(label, acct.Email)
	switch {
	case claim == "":
		return fmt.Sprintf("No handle: the name %q has a space or an @, so it claims none (a name without them claims <name>.%s).", label, acct.Email)
	case acct.OperatorName == "":
		return fmt.Sprintf("No handle yet: the account has no operator name, and %s is claimed only for an account with one. Give it one before the agent starts (the console's Operator name field, or meshd admin agent-token --operator NAME).", claim)
	case h == nil:
		return fmt.Sprintf("When the agent starts it claims the handle %s, unless someone claims it first.", claim)
	case h.AccountID != acct.ID && h.Email == acct.Email:
		return fmt.Sprintf("No handle: %s was claimed at the registrar before this account's address was verified, so the key cannot bind it. Bind the agent with a pairing code from the console's Handles page instead.", h.Handle)
	case h.AccountID != acct.ID:
		return fmt.Sprintf("No handle: %s is taken by another account.", h.Handle)
	case h.AgentID != "":
		return fmt.Sprintf("No handle, unless this key goes to the agent that already has it: %s is bound to agent %s.", h.Handle, h.AgentID)
	}
	return fmt.Sprintf("When the agent starts it binds the handle %s, which this account holds.", h.Handle)
}
