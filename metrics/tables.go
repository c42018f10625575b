package metrics

import (
	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/msg"
	"github.com/softrnic/softrnic/verbs"
)

// counter is one uint64 field of a counter set T, as published: name is its metric's
// name between the family's prefix and "_total". field names the Go field it reads (the
// tests check that every field is published, and read right).
type counter[T any] struct {
	field, name, help string
	get               func(*T) uint64
}

// packetCounters are the counters a QP and its device both have (verbs.Counters); a
// device's are the sums over its QPs, live and destroyed.
var packetCounters = []counter[verbs.Counters]{
	{"TxPackets", "tx_packets", "Packets sent.", func(c *verbs.Counters) uint64 { return c.TxPackets }},
	{"TxBytes", "tx_bytes", "Bytes sent, headers included.", func(c *verbs.Counters) uint64 { return c.TxBytes }},
	{"RxPackets", "rx_packets", "Packets received.", func(c *verbs.Counters) uint64 { return c.RxPackets }},
	{"RxBytes", "rx_bytes", "Bytes received, headers included.", func(c *verbs.Counters) uint64 { return c.RxBytes }},
	{"Retransmits", "retransmits", "Request packets sent again.", func(c *verbs.Counters) uint64 { return c.Retransmits }},
	{"NAKsSent", "naks_sent", "NAKs sent other than RNR NAKs (PSN sequence error, invalid request, remote access or operational error).", func(c *verbs.Counters) uint64 { return c.NAKsSent }},
	{"NAKsReceived", "naks_received", "NAKs received other than RNR NAKs.", func(c *verbs.Counters) uint64 { return c.NAKsReceived }},
	{"RNRNAKsSent", "rnr_naks_sent", "Receiver-not-ready NAKs sent.", func(c *verbs.Counters) uint64 { return c.RNRNAKsSent }},
	{"RNRNAKsReceived", "rnr_naks_received", "Receiver-not-ready NAKs received.", func(c *verbs.Counters) uint64 { return c.RNRNAKsReceived }},
	{"Duplicates", "duplicates", "Duplicate requests and responses received.", func(c *verbs.Counters) uint64 { return c.Duplicates }},
	{"OutOfSequence", "out_of_sequence", "Requests ahead of the expected PSN and responses out of order.", func(c *verbs.Counters) uint64 { return c.OutOfSequence }},
	{"Timeouts", "timeouts", "Local ACK timeouts that fired.", func(c *verbs.Counters) uint64 { return c.Timeouts }},
	{"WrongSource", "wrong_source", "Packets dropped for coming from an address other than the QP's peer.", func(c *verbs.Counters) uint64 { return c.WrongSource }},
	{"WrongMode", "wrong_mode", "Packets dropped for belonging to the other ordering mode (weak or ordered).", func(c *verbs.Counters) uint64 { return c.WrongMode }},
	{"Dropped", "dropped", "Packets dropped for the QP's state or a protocol violation.", func(c *verbs.Counters) uint64 { return c.Dropped }},
	{"QKeyErrors", "qkey_errors", "UD datagrams dropped for carrying another Q_Key.", func(c *verbs.Counters) uint64 { return c.QKeyErrors }},
	{"PlacedOutOfOrder", "placed_out_of_order", "Weak mode: packets placed while an earlier PSN was missing.", func(c *verbs.Counters) uint64 { return c.PlacedOutOfOrder }},
	{"HolesOpened", "holes_opened", "Weak mode: holes opened in the PSN space.", func(c *verbs.Counters) uint64 { return c.HolesOpened }},
	{"HolesClosed", "holes_closed", "Weak mode: holes closed in the PSN space.", func(c *verbs.Counters) uint64 { return c.HolesClosed }},
	{"SACKsSent", "sacks_sent", "Weak mode: selective acknowledgements sent.", func(c *verbs.Counters) uint64 { return c.SACKsSent }},
	{"SACKsReceived", "sacks_received", "Weak mode: selective acknowledgements received.", func(c *verbs.Counters) uint64 { return c.SACKsReceived }},
	{"SelectiveRetransmits", "selective_retransmits", "Weak mode: lost packets sent again alone.", func(c *verbs.Counters) uint64 { return c.SelectiveRetransmits }},
	{"BeyondSpan", "beyond_span", "Weak mode: packets dropped for lying past the arrival bitmap.", func(c *verbs.Counters) uint64 { return c.BeyondSpan }},
}

// deviceCounters are the counters only a device has.
var deviceCounters = []counter[verbs.Counters]{
	{"ICRCErrors", "icrc_errors", "Packets dropped for a bad ICRC.", func(c *verbs.Counters) uint64 { return c.ICRCErrors }},
	{"Malformed", "malformed", "Packets dropped for an undecodable header or a bad P_Key.", func(c *verbs.Counters) uint64 { return c.Malformed }},
	{"UnknownQP", "unknown_qp", "Packets dropped for a destination QP the device does not have.", func(c *verbs.Counters) uint64 { return c.UnknownQP }},
	{"DirectPlaced", "direct_placed", "RDMA WRITE packets whose payload was copied into place in the pass that checked their ICRC.", func(c *verbs.Counters) uint64 { return c.DirectPlaced }},
	{"FaultsLost", "faults_lost", "Fault injection: datagrams dropped.", func(c *verbs.Counters) uint64 { return c.FaultsLost }},
	{"FaultsReordered", "faults_reordered", "Fault injection: datagrams reordered.", func(c *verbs.Counters) uint64 { return c.FaultsReordered }},
	{"FaultsDuplicated", "faults_duplicated", "Fault injection: datagrams duplicated.", func(c *verbs.Counters) uint64 { return c.FaultsDuplicated }},
	{"FaultsCorrupted", "faults_corrupted", "Fault injection: datagrams with a bit flipped.", func(c *verbs.Counters) uint64 { return c.FaultsCorrupted }},
	{"SendCalls", "send_calls", "Send system calls (sendmmsg).", func(c *verbs.Counters) uint64 { return c.SendCalls }},
	{"RecvCalls", "recv_calls", "Receive system calls (recvmmsg) that returned datagrams.", func(c *verbs.Counters) uint64 { return c.RecvCalls }},
	{"GSOSends", "gso_sends", "GSO messages sent (each carries several packets).", func(c *verbs.Counters) uint64 { return c.GSOSends }},
	{"SendErrors", "send_errors", "Datagrams the kernel refused to send (dropped; retransmission recovers them).", func(c *verbs.Counters) uint64 { return c.SendErrors }},
	{"SendBlocked", "send_blocked", "Sends that waited for socket buffer space.", func(c *verbs.Counters) uint64 { return c.SendBlocked }},
}

// queueCounters are each receive queue's.
var queueCounters = []counter[verbs.QueueCounters]{
	{"RxPackets", "rx_packets", "Packets the receive queue's socket received.", func(c *verbs.QueueCounters) uint64 { return c.RxPackets }},
	{"RxBytes", "rx_bytes", "Bytes the receive queue's socket received.", func(c *verbs.QueueCounters) uint64 { return c.RxBytes }},
	{"RecvCalls", "recv_calls", "The receive queue's receive system calls that returned datagrams.", func(c *verbs.QueueCounters) uint64 { return c.RecvCalls }},
	{"Misrouted", "misrouted", "Packets for a QP of another receive queue (dropped).", func(c *verbs.QueueCounters) uint64 { return c.Misrouted }},
}

// handlerCounters are each completion handler's (its Pending and Latency are published
// as a gauge and a summary).
var handlerCounters = []counter[verbs.HandlerStats]{
	{"Events", "events", "Completion events queued to the handler.", func(c *verbs.HandlerStats) uint64 { return c.Events }},
	{"Calls", "calls", "Calls of the handler's function.", func(c *verbs.HandlerStats) uint64 { return c.Calls }},
	{"Rerouted", "rerouted", "Events the handler passed on (its function was removed, or the CQ was bound to another handler).", func(c *verbs.HandlerStats) uint64 { return c.Rerouted }},
	{"Dropped", "dropped", "Events for CQs destroyed before their turn.", func(c *verbs.HandlerStats) uint64 { return c.Dropped }},
}

// srqCounters are those of a QP on an SRQ (verbs.LimitStats; the per-limit and
// per-decision arrays are published with a label).
var srqCounters = []counter[verbs.LimitStats]{
	{"Taken", "taken", "SRQ receive WQEs the QP took.", func(c *verbs.LimitStats) uint64 { return c.Taken }},
	{"Polled", "polled", "Completions of the SRQ receive WQEs the QP took that were polled.", func(c *verbs.LimitStats) uint64 { return c.Polled }},
}

// cmCounters are a device's connection manager's (cm.Counters).
var cmCounters = []counter[cm.Counters]{
	{"REQSent", "req_sent", "ConnectRequests sent.", func(c *cm.Counters) uint64 { return c.REQSent }},
	{"REQRetries", "req_retries", "ConnectRequests sent again for want of an answer.", func(c *cm.Counters) uint64 { return c.REQRetries }},
	{"REQDuplicates", "req_duplicates", "ConnectRequests received again (the requester resent them).", func(c *cm.Counters) uint64 { return c.REQDuplicates }},
	{"REPSent", "rep_sent", "ConnectReplies sent.", func(c *cm.Counters) uint64 { return c.REPSent }},
	{"REPRetries", "rep_retries", "ConnectReplies sent again for want of a ReadyToUse.", func(c *cm.Counters) uint64 { return c.REPRetries }},
	{"RTUSent", "rtu_sent", "ReadyToUse messages sent.", func(c *cm.Counters) uint64 { return c.RTUSent }},
	{"MRASent", "mra_sent", "MessageReceiptAcknowledgements sent (asking a requester to wait for the application).", func(c *cm.Counters) uint64 { return c.MRASent }},
	{"MRAReceived", "mra_received", "MessageReceiptAcknowledgements received.", func(c *cm.Counters) uint64 { return c.MRAReceived }},
	{"REJSent", "rej_sent", "ConnectRejects sent.", func(c *cm.Counters) uint64 { return c.REJSent }},
	{"REJReceived", "rej_received", "ConnectRejects received.", func(c *cm.Counters) uint64 { return c.REJReceived }},
	{"DREQSent", "dreq_sent", "DisconnectRequests sent.", func(c *cm.Counters) uint64 { return c.DREQSent }},
	{"DREQRetries", "dreq_retries", "DisconnectRequests sent again for want of an answer.", func(c *cm.Counters) uint64 { return c.DREQRetries }},
	{"DREPSent", "drep_sent", "DisconnectReplies sent.", func(c *cm.Counters) uint64 { return c.DREPSent }},
	{"Established", "established", "Connections established.", func(c *cm.Counters) uint64 { return c.Established }},
	{"Disconnected", "disconnected", "Connections this side disconnected.", func(c *cm.Counters) uint64 { return c.Disconnected }},
	{"StaleRejects", "stale_rejects", "Requests rejected as stale (the peer's QP was connected here already); the old connection ended.", func(c *cm.Counters) uint64 { return c.StaleRejects }},
	{"Dropped", "dropped", "MADs dropped: malformed, of an unknown kind, or matching no connection.", func(c *cm.Counters) uint64 { return c.Dropped }},
	{"BacklogDrops", "backlog_drops", "ConnectRequests dropped because a listener's backlog was full.", func(c *cm.Counters) uint64 { return c.BacklogDrops }},
	{"KeepAliveProbes", "keepalive_probes", "Keep-alive probes sent to peer devices.", func(c *cm.Counters) uint64 { return c.KeepAliveProbes }},
	{"PeersLost", "peers_lost", "Peer devices the keep-alive gave up on (their connections ended).", func(c *cm.Counters) uint64 { return c.PeersLost }},
	{"PeerRestarts", "peer_restarts", "Peer devices found replaced by a new one at their address (their connections ended).", func(c *cm.Counters) uint64 { return c.PeerRestarts }},
	{"SendErrors", "send_errors", "MADs QP1 could not send.", func(c *cm.Counters) uint64 { return c.SendErrors }},
}

// sidrCounters are a device's service ID resolutions (cm.SIDRCounters).
var sidrCounters = []counter[cm.SIDRCounters]{
	{"REQSent", "req_sent", "Resolution requests sent.", func(c *cm.SIDRCounters) uint64 { return c.REQSent }},
	{"REQRetries", "req_retries", "Resolution requests sent again for want of an answer.", func(c *cm.SIDRCounters) uint64 { return c.REQRetries }},
	{"Resolved", "resolved", "Resolutions answered with success.", func(c *cm.SIDRCounters) uint64 { return c.Resolved }},
	{"Failed", "failed", "Resolutions answered with another status.", func(c *cm.SIDRCounters) uint64 { return c.Failed }},
	{"Timeouts", "timeouts", "Resolutions given up for want of an answer.", func(c *cm.SIDRCounters) uint64 { return c.Timeouts }},
	{"REQReceived", "req_received", "Resolution requests received.", func(c *cm.SIDRCounters) uint64 { return c.REQReceived }},
	{"REQDuplicates", "req_duplicates", "Resolution requests received again.", func(c *cm.SIDRCounters) uint64 { return c.REQDuplicates }},
	{"REPSent", "rep_sent", "Resolution replies sent.", func(c *cm.SIDRCounters) uint64 { return c.REPSent }},
	{"Unsupported", "unsupported", "Resolution requests answered for want of a listener.", func(c *cm.SIDRCounters) uint64 { return c.Unsupported }},
}

// msgCounters are a communicator's (msg.Comm.Stats).
var msgCounters = []counter[msg.Stats]{
	{"EagerSent", "eager_sent", "Messages sent through the eager rings.", func(c *msg.Stats) uint64 { return c.EagerSent }},
	{"EagerReceived", "eager_received", "Messages received through the eager rings.", func(c *msg.Stats) uint64 { return c.EagerReceived }},
	{"RendezvousSent", "rendezvous_sent", "Messages sent by rendezvous (RDMA WRITE into the receive buffer).", func(c *msg.Stats) uint64 { return c.RendezvousSent }},
	{"Rendezvous", "rendezvous_received", "Messages received by rendezvous.", func(c *msg.Stats) uint64 { return c.Rendezvous }},
	{"Enlargements", "enlargements", "Requests sent to a peer for a larger ring.", func(c *msg.Stats) uint64 { return c.Enlargements }},
	{"EnlargementsServed", "enlargements_served", "Rings enlarged at a peer's request.", func(c *msg.Stats) uint64 { return c.EnlargementsServed }},
	{"AckResends", "ack_resends", "Enlargement acknowledgements asked for again (lost, corrupt or late).", func(c *msg.Stats) uint64 { return c.AckResends }},
	{"CreditMessages", "credit_messages", "Credits given back in messages of their own.", func(c *msg.Stats) uint64 { return c.CreditMessages }},
	{"Connections", "connections", "Connections made.", func(c *msg.Stats) uint64 { return c.Connections }},
}
