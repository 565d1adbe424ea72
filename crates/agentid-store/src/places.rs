//! Status places: where a new agent's bit lives in a Token Status List of its mode.

use agentid_core::domain::KeyMode;

/// How a new agent gets its status place: in the newest list of its mode while it takes new
/// places (`status::takes_new_places`), else in a new list `new_list` of `size` places; at
/// the first of `draws` (modulo the list's size) that is free. Test and live agents never
/// share a list.
#[derive(Debug, Clone)]
pub struct PlaceDraw {
    pub mode: KeyMode,
    pub new_list: agentid_core::domain::ListId,
    pub size: u64,
    pub draws: Vec<u64>,
}
