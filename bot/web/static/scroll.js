// Keeps the newest message in view while it grows, unless the user has scrolled up to read.
//
// The page itself only ever scrolls down (to the bottom), and a message growing never
// moves the scroll position: so a scroll that goes up was the user's (wheel, touch, keys,
// scrollbar). From then on the view stays where they put it, until they are back at the
// bottom (or press "Newest", or send a message). Growth is caught by a ResizeObserver,
// whose callbacks run after layout and before paint: no frame shows the newest line under
// the message box.

const NEAR_BOTTOM_PX = 24;

export class FollowBottom {
  constructor(scroller, content, jumpButton) {
    this.scroller = scroller;
    this.jumpButton = jumpButton;
    this.following = true;
    this.lastTop = scroller.scrollTop;
    scroller.addEventListener("scroll", () => this.onScroll(), { passive: true });
    jumpButton.addEventListener("click", () => this.toBottom());
    const keep = new ResizeObserver(() => this.keep());
    keep.observe(content);
    keep.observe(scroller);
  }

  distance() {
    const { scrollHeight, scrollTop, clientHeight } = this.scroller;
    return scrollHeight - scrollTop - clientHeight;
  }

  onScroll() {
    const top = this.scroller.scrollTop;
    if (this.distance() <= NEAR_BOTTOM_PX) this.following = true;
    else if (top < this.lastTop) this.following = false;
    this.lastTop = top;
    this.showJump();
  }

  keep() {
    if (this.following) {
      this.scroller.scrollTop = this.scroller.scrollHeight;
      this.lastTop = this.scroller.scrollTop;
    }
    this.showJump();
  }

  // Follow again from here: after sending a message, or on "Newest".
  toBottom() {
    this.following = true;
    this.keep();
  }

  showJump() {
    this.jumpButton.hidden = this.following || this.distance() <= NEAR_BOTTOM_PX;
  }
}
