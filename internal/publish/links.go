package publish

import "github.com/celeriac/celeriac/protocol"

// LinkError adds errbacks to sig as Celery 5.2's link_error methods do,
// so that a canvas built in Go carries them where a Python-built one does:
// a task or a chain keeps them in its own link_error option (chain.run
// gives them to every step), a group gives them to each member, and a
// chord to its body only. Celery 5.5 and later also give a chord's
// errbacks to the chords in its header (celery/celery#9580, since
// 5.5.0rc5), and 5.3 and later to every header task with
// task_allow_error_cb_on_chord_header (off by default); this does
// neither.
func LinkError(sig protocol.Signature, errbacks ...protocol.Signature) protocol.Signature {
	if len(errbacks) == 0 {
		return sig
	}
	sig = sig.Clone()
	switch sig.SubtaskType {
	case "group":
		members, err := SignatureList(sig.Kwargs["tasks"])
		if err != nil {
			return sig
		}
		for i := range members {
			members[i] = LinkError(members[i], errbacks...)
		}
		sig.Kwargs["tasks"] = signatureValues(members)
		return sig
	case "chord":
		body, err := protocol.DecodeSignature(sig.Kwargs["body"])
		if err != nil {
			return sig
		}
		sig.Kwargs["body"] = LinkError(body, errbacks...).Value()
		return sig
	}
	return appendListOption(sig, "link_error", errbacks)
}

// appendListOption is Celery's Signature.append_to_list_option for a list
// of signatures: sig must be a clone the caller owns.
func appendListOption(sig protocol.Signature, key string, add []protocol.Signature) protocol.Signature {
	if sig.Options == nil {
		sig.Options = map[string]any{}
	}
	have, err := SignatureList(sig.Options[key])
	if err != nil {
		have = nil
	}
	sig.Options[key] = signatureValues(append(have, add...))
	return sig
}
