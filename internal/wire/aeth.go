package wire

// AETH syndromes (IBTA 9.7.5.2): the top three bits select the kind.
const (
	AETHAck   = 0x00 // ACK; low 5 bits: credit count (0x1F = invalid / not used)
	AETHRNR   = 0x20 // RNR NAK; low 5 bits: minimal RNR NAK timer (see RNRTimer)
	AETHNak   = 0x60 // NAK; low 5 bits: NAK code
	NoCredits = 0x1F // "invalid credit count": end-to-end credits are not used

	aethKind  = 0xE0
	aethValue = 0x1F
)

// NAK codes.
const (
	NakPSNSeqError       = 0
	NakInvalidRequest    = 1
	NakRemoteAccessError = 2
	NakRemoteOpError     = 3
	NakInvalidRDRequest  = 4
)

// AETHKind returns the syndrome's kind bits (AETHAck, AETHRNR or AETHNak).
func AETHKind(syn uint8) uint8 { return syn & aethKind }

// AETHValue returns the low five bits of the syndrome (credit, timer or NAK code).
func AETHValue(syn uint8) uint8 { return syn & aethValue }
