package protocol

// OrderedDict is a dict for [SafeRepr] whose keys render in the order
// given, as a Python dict read from JSON keeps its keys in the document's
// order (a map[string]any renders sorted). Values may be OrderedDicts,
// []any and the scalars SafeRepr takes. Only SafeRepr knows it; encode
// the plain map.
type OrderedDict struct {
	Keys   []string
	Values map[string]any
}
