'use strict';
// The Leases page's auto-refresh (?refresh=N, see django_locks/admin/leases.py): the page is
// loaded again every N seconds, except while a lease is selected for the release action or the
// search box is being typed in (a reload would lose them); then it waits another N seconds.
{
    const script = document.currentScript;
    const seconds = Number(script && script.dataset.seconds);
    if (seconds > 0) {
        const tick = function() {
            const busy = document.querySelector('.action-select:checked')
                || (document.activeElement && document.activeElement.id === 'searchbar');
            if (busy) {
                window.setTimeout(tick, seconds * 1000);
            } else {
                // A GET of the same address: never a POST sent again.
                window.location.replace(window.location.href);
            }
        };
        window.setTimeout(tick, seconds * 1000);
    }
}
